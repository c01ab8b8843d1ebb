"""Fixtures for tests against real processes: Triton, agents, Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from model_repo.artifacts import build_store
from model_repo.profiles import load_families

TEST_SCALE = 0.1
"""Artifact scale for tests: mobilenet_v3 small/large become ~1 MB / ~2 MB of weights."""


@pytest.fixture(scope="session")
def artifact_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A small artifact store (two mobilenet_v3 variants, one shufflenet) built once per run."""
    store = tmp_path_factory.mktemp("artifacts")
    families = load_families()
    build_store(store, [families["mobilenet_v3"], families["shufflenet_v2"]], scale=TEST_SCALE,
                variants=["mobilenet_v3_small", "mobilenet_v3_large", "shufflenet_v2_x0_5"])
    yield store


@pytest.fixture(scope="session")
def short_early_exit_family(tmp_path_factory: pytest.TempPathFactory
                            ) -> tuple[Path, dict[str, Any]]:
    """The early-exit digits family trained one epoch: (its manifest, its training record).

    Tests that need the family's exits and their times, not its best accuracy, share it (the
    full training is ``understudy models train-early-exit``).
    """
    pytest.importorskip("torch")
    from model_repo.digits_ee import MANIFEST_NAME, train_early_exit

    trained = tmp_path_factory.mktemp("digits_ee")
    record = train_early_exit(trained, epochs=1)
    return trained / MANIFEST_NAME, record


LOG_TAIL_LINES = 40
"""Lines of each testbed process's log a failure report shows (CI keeps no run directories)."""
CONTROLLER_LOG_TAIL_LINES = 200
"""The controller's: what it decided since the failure being waited for."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[object]:
    """A failed test that used a testbed or a gateway reports the tails of their logs."""
    report = yield
    if getattr(report, "failed", False):
        from deploy.gateway_process import GatewayProcess
        from deploy.testbed import Testbed

        for value in getattr(item, "funcargs", {}).values():
            if isinstance(value, Testbed):
                for title, text in testbed_log_tails(value):
                    report.sections.append((title, text))
            elif isinstance(value, GatewayProcess):  # a test's own gateway, beside a testbed
                path = value.run_dir / "gateway.log"
                report.sections.append((f"gateway log ({path})", log_tail(path, LOG_TAIL_LINES)))
    return report


def testbed_log_tails(bed: object) -> list[tuple[str, str]]:
    """(section title, last lines) for each process log of the testbed, controller first."""
    processes = bed.state.processes  # type: ignore[attr-defined]
    names = sorted(processes, key=lambda name: (name != "controller", name))
    tails = []
    for name in names:
        path = Path(processes[name].log)
        keep = CONTROLLER_LOG_TAIL_LINES if name == "controller" else LOG_TAIL_LINES
        tails.append((f"testbed log {name} ({path})", log_tail(path, keep)))
    return tails


def log_tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a log (or why it could not be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(unreadable: {exc})"
