"""``understudy sim experiment --mix-*``: another application mix than the calibrated one."""

from __future__ import annotations

import argparse

import pytest

from sim.cluster import CALIBRATED, FIG78_FIT, MixKnobs
from sim.report import markdown
from sim.timing import Timing
from understudy.cli import sim as sim_cli


def _options(*args: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sim_cli.register(parser.add_subparsers(dest="command").add_parser("sim"))
    return parser.parse_args(["sim", "experiment", "fig11", *args])


def test_no_mix_option_keeps_the_calibrated_mix() -> None:
    assert sim_cli.mix_knobs(_options()) == CALIBRATED


def test_the_fig7_8_fit_preset_and_options_on_top_of_it() -> None:
    assert sim_cli.mix_knobs(_options("--mix-preset", "fig7-8-fit")) == FIG78_FIT
    knobs = sim_cli.mix_knobs(_options("--mix-preset", "fig7-8-fit", "--mix-cap", "30"))
    assert knobs == MixKnobs(30.0, FIG78_FIT.rate_rps, FIG78_FIT.rate_distribution,
                             FIG78_FIT.large_scale_mix)


def test_every_mix_option_is_applied() -> None:
    knobs = sim_cli.mix_knobs(_options("--mix-cap", "20", "--mix-rates", "1-10",
                                       "--mix-distribution", "uniform",
                                       "--mix-families", "all"))
    assert knobs == MixKnobs(20.0, (1.0, 10.0), "uniform", "all")


@pytest.mark.parametrize(("args", "message"), [
    (("--mix-rates", "10"), "LOW-HIGH"),
    (("--mix-rates", "a-b"), "LOW-HIGH"),
    (("--mix-rates", "10-1"), "request rate"),
    (("--mix-cap", "150"), "max_primary_compute_pct"),
])
def test_bad_mix_values_are_refused_with_the_reason(args: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sim_cli.mix_knobs(_options(*args))


def test_the_report_says_which_mix_ran() -> None:
    other = MixKnobs(20.0, (1.0, 10.0), "uniform", "testbed")
    for knobs, says in ((CALIBRATED, "(the calibrated one"), (other, "(NOT the calibrated one")):
        text = markdown([], [], seeds=1, quick=True, wall_s=0.0, names=[], timing=Timing(),
                        knobs=knobs)
        assert f"Application mix: {knobs.label()} {says}" in text
