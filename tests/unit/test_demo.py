"""The demo prints a readable warm plan and failover plan for the generated cluster."""

from __future__ import annotations

import re

from understudy.cli.main import main


def test_demo_prints_warm_plan_failover_plan_and_baselines(capsys):
    assert main(["--log-level", "WARNING", "demo", "--servers", "6", "--sites", "3",
                 "--apps", "12", "--seed", "3", "--fail", "srv-001"]) == 0
    out = capsys.readouterr().out
    assert "Step 1 - proactive" in out and "Step 2 - server srv-001 fails" in out
    warm_rows = re.findall(r"^app-\d{4} .*@srv-\d{3}", out, flags=re.MULTILINE)
    assert len(warm_rows) == 6  # 12 apps, half of them critical
    summary = re.search(r"affected (\d+), recovered (\d+)", out)
    assert summary is not None and int(summary.group(1)) >= int(summary.group(2))
    for policy in ("understudy", "full-size-warm-k", "full-size-warm", "full-size-cold"):
        assert re.search(rf"^{policy}\s", out, flags=re.MULTILINE)
    assert "srv-001" not in "".join(re.findall(r"-> \S+@(srv-\d+)", out))


def test_demo_rejects_unknown_options(capsys):
    try:
        main(["demo", "--no-such-option"])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("argparse should have rejected the option")
    assert "unrecognized arguments" in capsys.readouterr().err
