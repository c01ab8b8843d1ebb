"""Judging a fault-injection run from samples of the records (``deploy.convergence``, issue 21)."""

from __future__ import annotations

from typing import Any

import pytest

from deploy.convergence import (
    AppObs,
    AppSpecObs,
    ReplicaObs,
    Sample,
    backups_above_primary,
    below_best,
    degraded_episodes,
    degraded_seconds,
    last_change,
    missing,
    pinned_violations,
    recoverable,
    recovered,
    recovery_times,
    registered_accuracy,
    strays,
    windows,
)
from deploy.declarations import KILL, SITE, STOP, TRITON, Injection

SITE_OF = {"s1": "a", "s2": "a", "s3": "b", "s4": "b"}
ACCURACY = {("fam", "small"): 0.8, ("fam", "mid"): 0.9, ("fam", "large"): 1.0}


def replica(server: str, variant: str = "mid", role: str = "primary",
            state: str = "ready", accuracy: float = 0.0) -> ReplicaObs:
    return ReplicaObs(server, variant, role, state, accuracy)


def app(app_id: str = "a", serving: tuple[str, str] | None = ("s1", "mid"),
        home: tuple[str, str] | None = ("s1", "mid"), status: str = "serving",
        replicas: tuple[ReplicaObs, ...] = ()) -> AppObs:
    return AppObs(app_id, status, serving, home, replicas)


def sample(at: float, *apps: AppObs, down: tuple[str, ...] = ()) -> Sample:
    from deploy.convergence import ServerObs

    servers = {s: ServerObs(s, site, s not in down) for s, site in SITE_OF.items()}
    return Sample(at, {a.app_id: a for a in apps}, servers)


def spec(app_id: str = "a", variant: str | None = "mid", **pins: Any) -> AppSpecObs:
    return AppSpecObs(app_id, "fam", variant, **pins)


SPECS = {"a": spec("a"), "b": spec("b")}


def test_samples_parse_from_the_api_views() -> None:
    views = [{"app_id": "a", "status": "degraded",
              "spec": {"app_id": "a", "family": "fam", "variant": "mid", "pinned_site": "b",
                       "pinned_server": None, "allow_larger_backups": False},
              "serving": {"server_id": "s3", "variant": "small"}, "home": ["s1", "mid"],
              "replicas": [{"server_id": "s3", "variant": "small", "role": "interim",
                            "state": "ready", "accuracy": 0.8}]}]
    servers = [{"server_id": "s1", "site_id": "a", "state": "failed", "connected": False},
               {"server_id": "s3", "site_id": "b", "state": "up", "connected": True}]
    parsed = Sample.from_views(5.0, views, servers)
    assert parsed.apps["a"] == app("a", ("s3", "small"), ("s1", "mid"), "degraded",
                                   (replica("s3", "small", "interim", accuracy=0.8),))
    assert not parsed.server_up("s1") and parsed.server_up("s3") and not parsed.server_up("s9")
    assert AppSpecObs.from_view(views[0]) == spec("a", pinned_site="b")


def test_the_last_change_is_the_later_of_the_fault_and_its_revivals() -> None:
    faults = [Injection(KILL, ("s1",), 100.0, {"s1": 120.0}),
              Injection(SITE, ("s1", "s2"), 200.0, {"s1": 215.0, "s2": 230.0}),
              Injection(STOP, ("s3",), 300.0)]
    assert [last_change(f) for f in faults] == [120.0, 230.0, 300.0]
    judged = windows(faults, 10.0, 400.0)
    assert [(w.start, w.end) for w in judged] == [(130.0, 200.0), (240.0, 300.0), (310.0, 400.0)]
    assert not judged[0].holds(130.0) and judged[0].holds(130.5) and judged[0].holds(200.0)


def test_a_declaration_inside_a_window_is_a_change_that_restarts_the_settle_time() -> None:
    faults = [Injection(KILL, ("s1",), 100.0, {"s1": 120.0}), Injection(STOP, ("s3",), 300.0)]
    # 150: a false alarm in the first window; 305: the stop's own declaration, before its
    # window; 400 is past the end of the run.
    judged = windows(faults, 10.0, 350.0, changes=[150.0, 305.0, 400.0])
    assert [(w.injection, w.start, w.end) for w in judged] == [
        (0, 130.0, 150.0), (0, 160.0, 300.0), (1, 315.0, 350.0)]
    assert not any(w.holds(155.0) for w in judged)
    # Two changes close together: nothing judged until 10 s after the later one.
    judged = windows(faults[:1], 10.0, 300.0, changes=[150.0, 152.0])
    assert [(w.start, w.end) for w in judged] == [(130.0, 150.0), (162.0, 300.0)]


@pytest.mark.parametrize(("observed", "down", "expected"), [
    (app(), (), None),
    (app(serving=None, status="unavailable"), (), "nothing serves it"),
    (app(home=None), (), "no home"),
    (app(serving=("s3", "small"), status="degraded"), (), "served by small on s3"),
    (app(serving=("s1", "small"), status="degraded"), (), "home mid on s1"),
    (app(serving=("s3", "mid")), ("s1",), "is down"),
    (app(serving=("s3", "large"), home=("s3", "large")), (), "not the registered mid"),
])
def test_below_best_is_anything_but_the_home_serving(observed: AppObs, down: tuple[str, ...],
                                                    expected: str | None) -> None:
    verdict = below_best(observed, SPECS["a"], sample(1.0, observed, down=down))
    if expected is None:
        assert verdict is None
    else:
        assert verdict is not None and expected in verdict[0]
        assert verdict[1] == (expected == "is down")


def test_degraded_time_counts_only_samples_in_a_window_until_the_next_sample() -> None:
    window = windows([Injection(KILL, ("s1",), 0.0, {"s1": 10.0})], 10.0, 30.0)
    away = app(serving=("s3", "small"), status="degraded")
    samples = [sample(t, away if t < 25.0 else app(), app("b")) for t in
               (15.0, 19.5, 20.0, 20.5, 21.0, 22.5, 24.0, 25.0, 29.5, 30.0, 30.5)]
    episodes = degraded_episodes(samples, window, SPECS)
    assert [(e.app_id, e.start, e.end, e.seconds) for e in episodes] == [
        ("a", 20.5, 25.0, 4.5)]
    assert degraded_seconds(episodes) == pytest.approx(4.5)


def test_a_stalled_poll_counts_at_most_the_gap_cap_and_a_new_reason_starts_a_new_stretch() -> None:
    window = windows([Injection(KILL, ("s1",), 0.0, {"s1": 0.0})], 1.0, 100.0)
    first = app(serving=("s3", "small"), status="degraded")
    second = app(serving=("s4", "mid"))
    samples = [sample(2.0, first), sample(50.0, first), sample(50.5, second),
               sample(51.0, app())]
    episodes = degraded_episodes(samples, window, SPECS, max_gap_s=2.0)
    assert [(e.reason.split(";")[0], e.seconds) for e in episodes] == [
        ("served by small on s3 (degraded)", 2.5), ("served by mid on s4 (serving)", 0.5)]


def test_a_stretch_whose_home_server_is_down_is_counted_apart() -> None:
    window = windows([Injection(KILL, ("s1",), 0.0, {"s1": 0.0})], 1.0, 4.0)
    away = app(serving=("s3", "mid"))
    episodes = degraded_episodes([sample(2.0, away, down=("s1",)), sample(3.0, away)],
                                 window, SPECS)
    assert degraded_seconds(episodes) == 1.0
    assert degraded_seconds(episodes, home_down=True) == 1.0


def test_a_degraded_app_before_the_settle_time_or_between_windows_is_not_counted() -> None:
    faults = [Injection(KILL, ("s1",), 0.0, {"s1": 5.0}), Injection(KILL, ("s2",), 40.0)]
    away = app(serving=("s3", "small"), status="degraded")
    samples = [sample(t, away) for t in (1.0, 10.0, 14.9, 15.0)]
    assert degraded_episodes(samples, windows(faults, 10.0, 60.0), SPECS) == []


def test_backups_above_the_registered_variant_are_counted_once_each() -> None:
    observed = app(replicas=(replica("s1", "mid"), replica("s3", "large", "warm"),
                             replica("s4", "small", "warm")))
    later = app(serving=("s3", "large"),
                replicas=(replica("s3", "large", "primary"), replica("s4", "large", "interim")))
    found = backups_above_primary([sample(1.0, observed), sample(2.0, later)], SPECS, ACCURACY)
    assert [(o.app_id, o.server_id, o.variant, o.first_seen, o.last_seen) for o in found] == [
        ("a", "s3", "large", 1.0, 2.0), ("a", "s4", "large", 2.0, 2.0)]


def test_an_app_that_allows_larger_backups_or_registered_the_best_has_none_above() -> None:
    observed = app(replicas=(replica("s3", "large", "warm"),))
    specs = {"a": spec("a", allow_larger_backups=True)}
    assert backups_above_primary([sample(1.0, observed)], specs, ACCURACY) == []
    assert backups_above_primary([sample(1.0, observed)], {"a": spec("a", None)}, ACCURACY) == []
    assert registered_accuracy(spec("a", None), ACCURACY) == 1.0


def test_a_variant_missing_from_the_profiles_is_judged_by_its_record() -> None:
    observed = app(replicas=(replica("s3", "other", "warm", accuracy=0.95),))
    assert len(backups_above_primary([sample(1.0, observed)], SPECS, ACCURACY)) == 1


def test_pinned_violations_follow_the_policies_pin_rules() -> None:
    specs = {"a": spec("a", pinned_site="a"), "b": spec("b", pinned_server="s1")}
    site_pinned = app("a", replicas=(replica("s1"), replica("s2", role="warm"),
                                     replica("s3", "small", "interim")))
    server_pinned = app("b", serving=("s2", "mid"), home=("s2", "mid"),
                        replicas=(replica("s2"), replica("s1", role="warm"),
                                  replica("s4", role="warm")))
    found = pinned_violations([sample(1.0, site_pinned, server_pinned),
                               sample(2.0, site_pinned)], specs, SITE_OF)
    assert [(o.app_id, o.server_id, o.role) for o in found] == [
        ("a", "s3", "interim"), ("b", "s2", "primary"), ("b", "s4", "warm")]
    fine = app("b", serving=("s2", "small"), replicas=(replica("s2", "small", "interim"),))
    assert pinned_violations([sample(1.0, fine)], specs, SITE_OF) == []


def test_apps_whose_pin_leaves_no_live_server_are_not_counted_as_affected() -> None:
    specs = {"a": spec("a", pinned_site="a"), "b": spec("b", pinned_server="s1"),
             "c": spec("c")}
    site = Injection(SITE, ("s1", "s2"), 0.0)
    assert recoverable(["a", "b", "c"], specs, SITE_OF, site) == ["c"]
    assert recoverable(["a", "b", "c"], specs, SITE_OF, Injection(KILL, ("s1",), 0.0)) == [
        "a", "b", "c"]
    assert recoverable(["a", "b"], specs, SITE_OF,
                       Injection(STOP, ("s1", "s2"), 0.0)) == ["a", "b"]


def test_recovered_means_served_by_a_live_server_the_fault_did_not_fail_before_until() -> None:
    fault = Injection(KILL, ("s1",), 10.0, {"s1": 40.0})
    samples = [
        sample(9.0, app("a", ("s3", "mid")), app("b", ("s1", "mid")), app("c", ("s3", "mid"))),
        sample(11.0, app("a", ("s1", "mid")), app("b", ("s4", "small"), status="recovering"),
               app("c", ("s1", "mid"), status="serving")),
        sample(12.0, app("a", ("s3", "small"), status="degraded"), app("b", ("s4", "mid")),
               app("c", ("s4", "mid")), down=("s1", "s4")),
        sample(45.0, app("b", ("s1", "mid")), app("c", ("s1", "mid"))),
    ]
    assert recovered(samples, ["a", "b", "c"], fault, until=30.0) == ["a"]
    assert recovery_times(samples, ["a", "b", "c"], fault, until=30.0) == {"a": 2.0}


def test_a_server_back_by_itself_recovers_its_own_apps_after_its_revival() -> None:
    fault = Injection(TRITON, ("s1",), 10.0, {"s1": 14.0})
    samples = [sample(12.0, app("a", ("s1", "mid")), down=("s1",)),
               sample(15.0, app("a", ("s1", "mid")))]
    assert recovered(samples, ["a"], fault, until=20.0) == ["a"]
    assert recovered(samples, ["a"], fault, until=13.0) == []


def test_strays_and_missing_compare_what_tritons_hold_with_the_records() -> None:
    records = [app("a", replicas=(replica("s1"), replica("s3", "small", "warm", "loading"))),
               app("b", replicas=(replica("s2", "small"),))]
    held = {"s1": {"a__mid", "a__large", "not-ours"}, "s3": {"a__small"}, "s2": set()}
    assert strays(held, records) == [("s1", "a__large")]
    assert missing(held, records) == [("s2", "b__small")]
    assert missing({"s1": {"a__mid"}}, records) == []
