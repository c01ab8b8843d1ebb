"""The early-exit digits family on a real Triton: input-dependent, server-measured time.

The family is trained (seeded, cached in a temporary folder for the session), written into a
store as ``understudy models import`` writes it, and served by a fresh Triton through the
per-server runtime. Held-out digits go one request at a time: each answer carries its exit and
the runtime's measure of its execution time, and requests that leave later must take
measurably longer, while the predictions match the model's own and its measured top-1.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from agent.early_exit_probe import probe, profile_variants, summary
from agent.profiler import link_model
from agent.triton import TritonServer
from agent.triton_config import TritonConfig
from model_repo.artifacts import find_variant
from model_repo.early_exit import EXEC_TIME_OUTPUT, EXIT_OUTPUT
from understudy.wire.ports import free_ports

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(900)
REQUESTS = 300


@pytest.fixture(scope="module")
def family(short_early_exit_family: tuple[Path, dict],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict]]:
    from model_repo.family_manifest import load_family_manifest
    from model_repo.imported import write_family

    # One epoch: these tests need the family's exits and their times, and compare the served
    # answers with this same training's own.
    manifest, record = short_early_exit_family
    store = tmp_path_factory.mktemp("store")
    write_family(store, load_family_manifest(manifest))
    yield store, record


def _local(store: Path, variant: str, inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The model's own predictions and exits, run here."""
    entry = find_variant(store, variant)
    module = torch.jit.load(str(entry.directory / entry.manifest.weights_file))
    with torch.inference_mode():
        logits, exits = module(torch.from_numpy(inputs))
    return logits.argmax(dim=1).numpy(), exits.numpy()


def test_later_exits_take_longer_and_answers_are_the_models(family, tmp_path: Path) -> None:
    store, record = family
    results = profile_variants(store, ["digits_ee"], tmp_path / "probe", REQUESTS)
    result = results["digits_ee"]
    per_exit = {row["exit"]: row for row in result["per_exit"]}
    assert len(per_exit) >= 3, f"the exits are not spread: {result}"
    times = [per_exit[e]["exec_us_p50"] for e in sorted(per_exit)]
    # Each later exit is slower than the one before, and the last one at least twice the first.
    assert all(b > a * 1.1 for a, b in zip(times, times[1:], strict=False)), result
    assert times[-1] >= 2.0 * times[0], result
    assert result["exec_p99_over_p50"] > 1.5
    # The round trip grows with the exit too: the server's time is real time.
    trips = [per_exit[e]["round_trip_us_p50"] for e in sorted(per_exit)]
    assert trips[-1] > trips[0] + 0.5 * (times[-1] - times[0])
    # Correct answers: the top-1 measured at training, on these few hundred held-out digits.
    assert result["top1"] >= record["variants"]["digits_ee"]["top1"] - 0.03


def test_both_backends_answer_the_models_exits(family, tmp_path: Path) -> None:
    store, _ = family
    with np.load(store / "digits_ee" / "evaluation.npz") as data:
        inputs = data["inputs"][:64]
    predicted, exits = _local(store, "digits_ee_s", inputs)
    for backend in ("understudy", "python"):
        ports = free_ports(3)
        server = TritonServer(TritonConfig(
            model_repository=tmp_path / f"repo-{backend}", work_dir=tmp_path / f"work-{backend}",
            http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2],
            model_backend=backend))  # type: ignore[arg-type]
        server.start()
        try:
            entry = find_variant(store, "digits_ee_s")
            model = link_model(server.config.model_repository, entry, server.model_backend)
            server.load(model)
            # Batches of 8: each member gets its own exit and time.
            got_exits, got_predicted, got_times = [], [], []
            for start in range(0, len(inputs), 8):
                out = server.infer_outputs(model, inputs[start:start + 8],
                                           ["logits", EXIT_OUTPUT, EXEC_TIME_OUTPUT])
                assert out[EXIT_OUTPUT].shape == (8, 1) and out[EXIT_OUTPUT].dtype == np.int32
                got_exits += out[EXIT_OUTPUT][:, 0].tolist()
                got_predicted += out["logits"].argmax(axis=1).tolist()
                got_times += out[EXEC_TIME_OUTPUT][:, 0].tolist()
            assert np.mean(np.asarray(got_exits) == exits) >= 0.97, backend
            assert np.mean(np.asarray(got_predicted) == predicted) >= 0.97, backend
            assert min(got_times) > 0
            single = summary(probe(server, model, inputs[:16]))
            assert single["requests"] == 16
        finally:
            server.stop()
