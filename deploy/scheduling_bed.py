"""A live bed for the gateway's batch schedulers: one Triton, one gateway, apps routed to it.

Shared by ``bench/orloj.py`` and the integration tests. What it sets up, as an operator would
from the pieces that exist:

- a family (``digits``; ``digits_ee``, the early-exit one, where the project has it) trained
  and written into an artifact store (``model_repo.imported.write_family``, no profiling);
- one Triton (Python backend, through the per-server runtime) serving chosen variants, each
  under the model name ``<model>__<variant>``, with Triton's own dynamic batcher taken out of
  the config, so the gateway's scheduler is the only one forming batches (its batches reach
  Triton whole);
- an ``understudy gateway`` whose routing table (``routes.json`` in its run directory, the
  table a gateway keeps across restarts) sends any number of apps to those models, with no
  controller reachable, so nothing but the request path is measured; each app gets its own
  ``--scheduler`` and ``--slo-ms``.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from deploy.gateway_process import GatewayProcess
from deploy.gateway_process import start_gateway as start_process
from understudy.client import Location
from understudy.wire.ports import free_port, free_ports

REPO = Path(__file__).resolve().parents[1]
EARLY_EXIT_FAMILY = "digits_ee"


@dataclass(frozen=True)
class ServedModel:
    """A variant in the store and the Triton model name it is served under."""

    family: str
    variant: str
    model_name: str


def early_exit_available() -> bool:
    """Whether this checkout has the early-exit family."""
    try:
        importlib.import_module(f"model_repo.{EARLY_EXIT_FAMILY}")
    except ImportError:
        return False
    return True


def train_family(family: str, runs: Path = REPO / "runs") -> Path:
    """Train ``digits`` or ``digits_ee`` (cached in ``runs/<family>``); its manifest's path."""
    if family == EARLY_EXIT_FAMILY:
        module = importlib.import_module(f"model_repo.{EARLY_EXIT_FAMILY}")
        module.train_early_exit(runs / family)
        return runs / family / str(module.MANIFEST_NAME)
    from model_repo.digits import MANIFEST_NAME, train_digits

    train_digits(runs / family)
    return runs / family / MANIFEST_NAME


def write_repository(store: Path, repository: Path, models: Sequence[ServedModel],
                     trained: Mapping[str, Path] | None = None) -> None:
    """Write the models' Triton directories (Python backend, no dynamic batcher).

    ``trained`` gives the manifest of a family trained elsewhere (tests train shorter); the
    others are trained here (cached in ``runs/``).
    """
    from agent.profiler import link_model
    from model_repo.artifacts import StoreEntry
    from model_repo.family_manifest import load_family_manifest
    from model_repo.imported import write_family

    manifests = {}
    for family in sorted({m.family for m in models}):
        manifest_path = (trained or {}).get(family) or train_family(family)
        for manifest in write_family(store, load_family_manifest(manifest_path)):
            manifests[(family, manifest.variant)] = manifest
    repository.mkdir(parents=True, exist_ok=True)
    for model in models:
        manifest = manifests[(model.family, model.variant)]
        entry = StoreEntry(model.family, model.variant, store / model.family / model.variant,
                           manifest)
        link_model(repository, entry, "python", name=model.model_name)
        config = repository / model.model_name / "config.pbtxt"
        lines = [line for line in config.read_text().splitlines()
                 if not line.startswith("dynamic_batching")]
        config.write_text("\n".join(lines) + "\n")


def start_triton(root: Path, repository: Path, models: Sequence[ServedModel]) -> object:
    """A started Triton with the models loaded (``agent.triton.TritonServer``)."""
    from agent.triton import TritonServer
    from agent.triton_config import TritonConfig

    http_port, grpc_port, metrics_port = free_ports(3)
    triton = TritonServer(TritonConfig(
        model_repository=repository, work_dir=root / "triton", http_port=http_port,
        grpc_port=grpc_port, metrics_port=metrics_port,
        model_backend="python", start_timeout_s=120))
    triton.start()
    for model in models:
        triton.load(model.model_name)
    return triton


def write_routes(run_dir: Path, http: str, grpc: str, apps: Mapping[str, ServedModel]) -> None:
    """A routing table sending each app to its model on one Triton."""
    table = {}
    for app_id, model in apps.items():
        location = Location(http=http, grpc=grpc, model_name=model.model_name,
                            server_id="bench", variant=model.variant, accuracy=1.0, seq=1)
        table[app_id] = {"serving": asdict(location), "backups": [], "seq": 1, "reason": ""}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "routes.json").write_text(json.dumps({"version": 1, "last_seq": 1,
                                                      "apps": table}))


Gateway = GatewayProcess
"""An ``understudy gateway`` process with no controller."""


def start_gateway(run_dir: Path, schedulers: Mapping[str, str],
                  slo_ms: Mapping[str, float], *extra: str) -> Gateway:
    """A gateway on a free port routing from ``run_dir``'s table; ready when returned."""
    dead = free_port()  # no controller: the gateway routes from the table it was given
    options = list(extra)
    for app_id, name in schedulers.items():
        options += ["--scheduler", f"{app_id}={name}"]
    for app_id, slo in slo_ms.items():
        options += ["--slo-ms", f"{app_id}={slo:.3f}"]
    return start_process(run_dir, f"http://127.0.0.1:{dead}", *options)
