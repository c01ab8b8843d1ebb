"""A live testbed for parity models (ParM), for benches and tests.

What it sets up: a store with the digits family and its parity models, apps protected by them
(or by their baselines), and the gateway in front.

Shared by ``bench/parm_tail.py`` and the integration tests, so both deploy ParM the way an
operator does: ``understudy models train-digits`` and ``models import`` (here with few
measurements), ``understudy parity train --store``, an app registered with ``"protection":
"parity:k"``, and ``understudy gateway``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploy.gateway_process import GatewayProcess as GatewayProcess  # re-exported
from deploy.gateway_process import start_gateway as start_gateway  # re-exported
from deploy.testbed import Testbed, wait_until

if TYPE_CHECKING:
    from parity.training import TrainingSettings

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
FAMILY = "digits"


def prepare_store(store: Path, variant: str, ks: Sequence[int], *,
                  digits_dir: Path = REPO / "runs" / "digits",
                  parity_dir: Path = REPO / "runs" / "parity",
                  work_dir: Path | None = None,
                  settings: TrainingSettings | None = None) -> list[str]:
    """The digits family (trained and imported, cached) and its parity models in ``store``.

    ``settings``: how the parity models train (default: each variant's own, as ``understudy
    parity train``); tests that need a working parity model, not an accurate one, train it
    shorter, into a ``parity_dir`` of their own. Returns the parity models' names.
    """
    from agent.model_import import import_family
    from agent.profiler import ProfileSettings
    from model_repo.digits import MANIFEST_NAME, train_digits
    from parity.artifacts import train_parity_model
    from parity.store import import_parity_models

    train_digits(digits_dir)
    import_family(digits_dir / MANIFEST_NAME, store, work_dir or store.parent / "import",
                  ProfileSettings(repeats=1, latency_requests=10, batch_sizes=(1,)),
                  device="cpu")
    names = [train_parity_model(variant, k, digits_dir=digits_dir, out_dir=parity_dir,
                                settings=settings).name for k in ks]
    import_parity_models(parity_dir, store, names)
    return names


def register(bed: Testbed, app_id: str, variant: str, *, protection: str = "replicas",
             instances: int | None = None, rate_rps: float = 50.0, critical: bool = False,
             timeout_s: float = 120.0) -> dict[str, Any]:
    """Register a digits app and wait until all its instances and parity models are ready."""
    spec: dict[str, Any] = {"app_id": app_id, "family": FAMILY, "variant": variant,
                            "protection": protection, "max_rate_rps": rate_rps,
                            "critical": critical}
    if instances is not None:
        spec["instances"] = instances
    reply = bed.http.post("/v1/apps", json=spec, params={"wait": "true"})
    reply.raise_for_status()
    return wait_protected(bed, app_id, timeout_s)


def wait_protected(bed: Testbed, app_id: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """Wait until the app serves with every instance and parity model it asks for; its view."""
    view: dict[str, Any] = {}

    def ready() -> bool:
        nonlocal view
        view = bed.http.get(f"/v1/apps/{app_id}").json()
        spec = view["spec"]
        k = int(spec["protection"].split("parity:")[1][0]) if "parity:" in spec[
            "protection"] else None
        count = spec.get("instances") or k or 1
        ready_roles = [r["role"] for r in view["replicas"] if r["state"] == "ready"]
        return (view["serving"] is not None
                and ready_roles.count("instance") == count - 1
                and ready_roles.count("parity") == (count // k if k else 0))

    wait_until(f"{app_id}'s instances and parity models", ready, timeout_s, 0.1)
    return view


def servers_of(view: dict[str, Any]) -> dict[str, list[str]]:
    """The servers of an app's view by role: ``serving``, ``instance``, ``parity``."""
    found: dict[str, list[str]] = {"serving": [view["serving"]["server_id"]]}
    for replica in view["replicas"]:
        if replica["state"] == "ready" and replica["role"] in ("instance", "parity"):
            found.setdefault(replica["role"], []).append(replica["server_id"])
    return found


