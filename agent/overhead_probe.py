"""The serving path's share of a request's latency, measured with a model that computes nothing.

An imported variant's compute is derived from its measured batch-1 latency
(``model_repo.imported.family_document``): the latency less what the serving path itself takes
(HTTP, Triton's queue and dynamic batcher, the backend and the runtime's socket). That share
is not a constant of the model: it is measured here, on the Triton that measures the variants,
with a probe that has the family's tensors and returns zeros of the output's shape. The probe is
served exactly as a wrapped variant is (the per-server runtime, TorchScript), so a variant
whose latency is no higher than the probe's gets no compute.

The figure kept is the probe's p90, not its p50: on a busy machine a request's latency jitters
by a fraction of a millisecond, and a model whose compute is within that jitter has none that
can be told apart from it (two such variants would otherwise be ranked by noise).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from agent.profiler import (
    ProfileSettings,
    link_model,
    request_latencies_ms,
    sample_batch,
    tensor_names,
)
from agent.triton import TritonServer
from agent.triton_config import TritonError
from model_repo.artifacts import StoreEntry
from understudy.wire.artifacts import Manifest, TensorSpec

logger = logging.getLogger(__name__)

PROBE_MODEL = "understudy_overhead_probe"
PROBE_FILE = "model.pt"
OVERHEAD_PERCENTILE = 90.0


def write_probe(directory: Path, manifest: Manifest) -> StoreEntry | None:
    """A TorchScript probe with ``manifest``'s input and output names; None if it has none."""
    if not manifest.inputs or not manifest.outputs:
        return None
    import torch

    source, target = manifest.inputs[0], manifest.outputs[0]
    shape = [max(1, d) for d in target.dims]

    class Probe(torch.nn.Module):
        def __init__(self, shape: list[int]) -> None:
            super().__init__()
            self.shape = shape

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.zeros([x.shape[0]] + self.shape, dtype=torch.float32)

    directory.mkdir(parents=True, exist_ok=True)
    torch.jit.script(Probe(shape)).save(str(directory / PROBE_FILE))
    probe = Manifest(
        family=manifest.family, variant=PROBE_MODEL, profiled_size_mb=1e-6, scale=1.0,
        weights_mb=1e-6, weights_sha256="0" * 64, max_batch_size=manifest.max_batch_size,
        format="torchscript", weights_file=PROBE_FILE, inputs=(source,),
        outputs=(TensorSpec(name=target.name, dims=tuple(shape)),))
    return StoreEntry(manifest.family, PROBE_MODEL, directory, probe)


class OverheadProbe:
    """The probe loaded on ``server`` for a whole import; :meth:`measure` before each variant."""

    def __init__(self, server: TritonServer, entry: StoreEntry, settings: ProfileSettings,
                 device: str = "cpu") -> None:
        self.server = server
        self.entry = entry
        self.settings = settings
        self.model = link_model(server.config.model_repository, entry, server.model_backend,
                                device=device)
        self.loaded = False

    def measure(self) -> float | None:
        """The probe's p90 batch-1 latency now, ms; None (logged) when it cannot be served."""
        names = tensor_names(self.entry.manifest)
        image = sample_batch(self.entry.manifest, 1)
        try:
            if not self.loaded:
                self.server.load(self.model)
                self.loaded = True
            for _ in range(self.settings.warmup_requests):
                self.server.infer(self.model, image, *names)
            latencies = request_latencies_ms(self.server, self.model, image, names,
                                             self.settings.latency_requests)
        except TritonError as exc:
            logger.warning("the overhead probe could not be served (%s); compute falls back "
                           "to the fixed overhead", exc)
            return None
        return float(np.percentile(np.asarray(latencies), OVERHEAD_PERCENTILE))

    def close(self) -> None:
        """Unload the probe (best effort)."""
        if self.loaded:
            try:
                self.server.unload(self.model)
            except TritonError as exc:
                logger.warning("unloading the overhead probe: %s", exc)
            self.loaded = False
