"""``understudy graph`` (the simulator path; processes are covered by the integration tests)
and the failover campaign the benchmark runs."""

from __future__ import annotations

import json

import pytest

from stateful.campaign import run_trial
from stateful.messages import Mode
from understudy.cli.main import main


def test_graph_spec_prints_a_valid_graph(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["graph", "spec", "--service", "ol", "--batch-size", "4"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["batch_size"] == 4 and {"frontend", "camera"} <= {e[0] for e in spec["edges"]}


def test_graph_run_on_the_simulator_with_a_kill(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--log-level", "ERROR", "graph", "run", "--sim", "--service", "sp",
                 "--requests", "40", "--noise-seed", "2", "--kill", "sentiment:primary@10"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "40/40 replies" in out and "promoted ['sentiment'" in out
    assert "0 inconsistencies" in out


def test_bad_kill_spec_is_rejected() -> None:
    with pytest.raises(SystemExit):
        main(["graph", "run", "--kill", "sentiment:leader"])


def test_campaign_nspb_stays_consistent_while_strawman_breaks() -> None:
    totals = {Mode.NSPB: [0, 0, 0], Mode.STRAWMAN: [0, 0, 0]}
    for seed in range(30):
        for mode, total in totals.items():
            result = run_trial(seed, mode)
            total[0] += result.failovers
            total[1] += result.inconsistencies
            total[2] += result.lost
    assert totals[Mode.NSPB][0] == totals[Mode.STRAWMAN][0] >= 20
    assert totals[Mode.NSPB][1:] == [0, 0]
    assert totals[Mode.STRAWMAN][1] > 0, "the checker must catch the strawman"
