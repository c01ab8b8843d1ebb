"""The live benches' repeats: finish rates combine as medians, outcomes as sums."""

from __future__ import annotations

from tests.unit.scripts import load_script


def _run(rate: float, finished: int, late: int) -> dict[str, object]:
    return {"finish_rate": {"dynamic": {"orloj": {"1x": rate}}},
            "outcomes": {"dynamic": {"orloj": {"1x": {"finished": finished, "late": late}}}}}


def test_orloj_repeats_give_median_finish_rates_and_summed_outcomes() -> None:
    orloj = load_script("bench/orloj.py")
    combined = orloj.combine([_run(0.5, 5, 5), _run(0.9, 9, 1), _run(0.6, 6, 4)])
    assert combined["finish_rate"] == {"dynamic": {"orloj": {"1x": 0.6}}}
    assert combined["outcomes"] == {"dynamic": {"orloj": {"1x": {"finished": 20, "late": 10}}}}
    assert [r["dynamic"]["orloj"]["1x"] for r in combined["finish_rate_by_repeat"]] == [
        0.5, 0.9, 0.6]
