"""Every failure declaration judged against what a run injected (``deploy.declarations``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.declarations import Declaration
from deploy.declarations import (
    KILL,
    SITE,
    STOP,
    Injection,
    classify,
    describe,
    missed,
    parse,
    tally,
)
from deploy.report import plot, print_declarations


def declared(server: str, at: float, seq: int = 1, moved: tuple[str, ...] = (),
             reason: str = "connection closed", silent_s: float = 0.0) -> Declaration:
    """A declaration of ``server`` at wall time ``at``."""
    return Declaration(seq=seq, server_id=server, site_id="site-1", reason=reason,
                       detected_at=at, last_seen=at - silent_s, apps_moved=list(moved))


def killed(*servers: str, at: float, revived: dict[str, float] | None = None,
           kind: str = KILL) -> Injection:
    """An injection of ``servers`` at ``at``, revived (completed) at the given instants."""
    return Injection(kind=kind, servers=servers, at=at, revived=revived or {})


def test_a_declaration_of_a_killed_server_before_its_revival_is_true() -> None:
    verdicts = classify([declared("s1", 100.012)], [killed("s1", at=100.0,
                                                           revived={"s1": 130.0})])
    assert [v.injection for v in verdicts] == [0]
    assert not verdicts[0].false


@pytest.mark.parametrize("at", [99.9, 130.0, 200.0], ids=["before", "at-revival", "after"])
def test_outside_the_failure_window_a_declaration_is_false(at: float) -> None:
    verdicts = classify([declared("s1", at)], [killed("s1", at=100.0, revived={"s1": 130.0})])
    assert verdicts[0].false


def test_a_server_the_run_never_failed_is_a_false_declaration_with_its_moved_apps() -> None:
    injections = [killed("s1", at=100.0, revived={"s1": 130.0})]
    verdicts = classify([declared("s1", 100.01, 1), declared("s2", 100.02, 2, ("a", "b"))],
                        injections)
    assert [v.false for v in verdicts] == [False, True]
    counts = tally(verdicts, injections)
    assert counts["declarations_true"] == 1
    assert counts["false_declarations"] == 1
    assert counts["apps_moved_by_false_declarations"] == 2


def test_a_late_declaration_while_the_revival_is_under_way_belongs_to_the_failure() -> None:
    # The agent was restarted at 120 but the controller saw it up only at 125.
    verdicts = classify([declared("s1", 122.0)], [killed("s1", at=100.0,
                                                         revived={"s1": 125.0})])
    assert not verdicts[0].false


def test_a_server_never_revived_stays_failed() -> None:
    verdicts = classify([declared("s1", 5000.0)], [killed("s1", at=100.0)])
    assert not verdicts[0].false


def test_a_site_failure_makes_each_of_its_servers_declaration_true_and_no_other() -> None:
    site = killed("s1", "s4", "s7", at=50.0, kind=SITE,
                  revived={"s1": 80.0, "s4": 82.0, "s7": 81.0})
    declarations = [declared("s1", 50.010, 1), declared("s4", 50.020, 2),
                    declared("s7", 50.030, 3), declared("s2", 50.040, 4, ("x",))]
    verdicts = classify(declarations, [site])
    assert [v.false for v in verdicts] == [False, False, False, True]
    # Each server's own revival closes its window.
    assert classify([declared("s4", 81.5)], [site])[0].false is False
    assert classify([declared("s7", 81.5)], [site])[0].false is True
    counts = tally(verdicts, [site])
    assert counts["crash_detection_p50_ms"] == pytest.approx(20.0)
    assert counts["crash_detection_p99_ms"] == pytest.approx(30.0)
    assert counts["injections"] == {KILL: 0, STOP: 0, SITE: 1}


def test_each_server_of_a_site_is_timed_from_its_own_signal_where_recorded() -> None:
    record = {"servers": ["s1", "s4"], "at": 50.0, "kind": SITE, "site": "site-1",
              "signalled": {"s1": 50.0, "s4": 50.040}}
    site = Injection.from_record(record)
    verdicts = classify([declared("s1", 50.004, 1), declared("s4", 50.045, 2)], [site])
    counts = tally(verdicts, [site])
    # s4 was signalled 40 ms after the site's instant: its detection took 5 ms, not 45.
    assert counts["crash_detection_p99_ms"] == pytest.approx(5.0)
    assert site.signalled_at("s9") == 50.0  # not recorded: the injection's instant


def test_a_stopped_server_is_a_true_declaration_timed_as_silent_detection() -> None:
    stop = killed("s3", at=10.0, kind=STOP, revived={"s3": 13.2})
    verdicts = classify([declared("s3", 10.095, reason="silent", silent_s=0.09)], [stop])
    counts = tally(verdicts, [stop])
    assert not verdicts[0].false
    assert counts["silent_detection_p99_ms"] == pytest.approx(95.0)
    assert counts["crash_detection_p99_ms"] is None


def test_repeated_failures_of_one_server_match_the_right_injection() -> None:
    injections = [killed("s1", at=100.0, revived={"s1": 130.0}),
                  killed("s1", at=200.0, revived={"s1": 230.0})]
    verdicts = classify([declared("s1", 100.01, 1), declared("s1", 150.0, 2),
                         declared("s1", 200.02, 3)], injections)
    assert [v.injection for v in verdicts] == [0, None, 1]


def test_an_injected_server_never_declared_is_a_missed_detection() -> None:
    injections = [killed("s1", "s4", at=50.0, kind=SITE), killed("s2", at=90.0, kind=STOP)]
    verdicts = classify([declared("s1", 50.01)], injections)
    assert missed(injections, verdicts) == [(0, "s4"), (1, "s2")]
    assert tally(verdicts, injections)["missed_detections"] == 2


def test_a_false_declaration_does_not_stand_for_a_missed_one() -> None:
    # Declared, but after its revival: the failure itself went undetected.
    injections = [killed("s1", at=100.0, revived={"s1": 130.0})]
    verdicts = classify([declared("s1", 131.0)], injections)
    assert missed(injections, verdicts) == [(0, "s1")]


def test_recorded_failures_and_listed_declarations_parse() -> None:
    old = Injection.from_record({"servers": ["s2"], "at": 12.5})
    assert (old.kind, old.servers, dict(old.revived)) == (KILL, ("s2",), {})
    new = Injection.from_record({"servers": ["s1", "s4"], "at": 1.0, "kind": SITE,
                                 "site": "site-1", "revived": {"s1": 9.0}})
    assert (new.kind, new.site, new.revived["s1"]) == (SITE, "site-1", 9.0)
    raw = [declared("s2", 3.0, seq=2).model_dump(), declared("s1", 2.0, seq=1).model_dump()]
    assert [d.seq for d in parse(raw)] == [1, 2]


def test_a_false_declaration_is_shown_in_full_in_the_report(tmp_path: Path) -> None:
    injections = [killed("s1", at=100.0, revived={"s1": 130.0})]
    verdicts = classify([declared("s1", 100.01, 1),
                         declared("s5", 104.0, 2, ("app-0003",), reason="silent",
                                  silent_s=0.12)], injections)
    line = describe(verdicts[1], injections, origin=100.0)
    assert "FALSE" in line and "s5" in line and "app-0003" in line
    assert "silent 120 ms" in line and "'silent'" in line
    written: list[str] = []
    counts = print_declarations(verdicts, injections, 100.0, written.append)
    text = "".join(written)
    assert counts["false_declarations"] == 1
    assert "1 false" in text and "! #2 s5" in text
    failures = [{"servers": ["s1"], "at": 100.0}]
    requests = [{"app_id": "app-0003", "sent_at": 99.0 + i / 10, "done_at": 99.05 + i / 10,
                 "ok": True, "server_id": "s2"} for i in range(100)]
    assert plot(failures, [], requests, tmp_path / "report.png", verdicts=verdicts) is not None
    assert (tmp_path / "report.png").stat().st_size > 0
