"""The testbed's workload: the generated apps, the server capacity they need, and registering them.

One definition for the local testbed (``understudy testbed up``), the container topology
(``docker-compose.yml``, whose ``register`` job runs ``understudy testbed register``) and the
tests that check the two agree: the same topology and seed give the same app ids, specs and
per-server capacity everywhere.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from deploy.topology import ServerSpec, Topology
from model_repo.profiles import load_families
from policies.model import ClusterSnapshot
from policies.resources import Resources
from sim.generator import generate_cluster

logger = logging.getLogger(__name__)

DEFAULT_SEED = 0
DEFAULT_RATE_RPS = (1.0, 5.0)
"""Range of the generated apps' ``max_rate_rps`` (the testbed's clients send 5 req/s)."""


NEXT_CURSOR = "X-Next-Cursor"
"""Header of a list page that is not the last (``controller.views``)."""


class RegistrationError(RuntimeError):
    """The controller refused an app, or an app registered earlier has a different spec."""


def list_all(http: httpx.Client, path: str, **params: Any) -> list[dict[str, Any]]:
    """Every item of a paged list endpoint (``/v1/apps``, ``/v1/servers``, ...), page by page."""
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        query = {**params, **({"cursor": cursor} if cursor is not None else {})}
        response = http.get(path, params=query)
        response.raise_for_status()
        items += response.json()
        cursor = response.headers.get(NEXT_CURSOR)
        if cursor is None:
            return items


@dataclass(frozen=True)
class Workload:
    """The generated cluster of a topology: app specs in registration order, server capacity."""

    cluster: ClusterSnapshot
    specs: tuple[dict[str, Any], ...]
    capacity: dict[str, float]

    @property
    def app_ids(self) -> list[str]:
        """The ids the registration creates, in registration order."""
        return [spec["app_id"] for spec in self.specs]

    def sized(self, topology: Topology) -> Topology:
        """``topology`` with every server's capacity set to what the generator sized."""
        servers = tuple(ServerSpec(s.server_id, s.site_id, self.capacity["memory_mb"],
                                   self.capacity["compute"]) for s in topology.servers)
        return Topology(servers=servers, sites=topology.sites, apps=topology.apps,
                        critical_fraction=topology.critical_fraction,
                        headroom=topology.headroom, families=topology.families)


def generate_workload(topology: Topology, seed: int = DEFAULT_SEED,
                      rate_rps: tuple[float, float] = DEFAULT_RATE_RPS,
                      stores: Sequence[Path] = ()) -> Workload:
    """The apps and server capacity of ``topology`` (deterministic for a given ``seed``).

    ``stores``: artifact stores whose imported families (digits) the topology may name.

    With no apps to size for (``topology.apps == 0``: the user registers their own), the
    servers get this machine's real capacity (:func:`machine_capacity`), not nothing.
    """
    families = load_families(stores=stores)
    cluster = generate_cluster(families, servers=len(topology.servers),
                               sites=len(topology.sites), apps=topology.apps,
                               headroom=topology.headroom,
                               critical_fraction=topology.critical_fraction, seed=seed,
                               family_names=topology.families, rate_rps=rate_rps)
    # Largest first, as the generator placed them: registered in this order (one by one, or
    # as one batch that the controller places in order on one snapshot), the primaries land
    # where the generator found room for them all.
    apps = sorted(cluster.apps, key=lambda a: -cluster.primary_variant(a).memory_mb)
    specs = tuple({"app_id": app.app_id, "family": app.family, "critical": app.critical,
                   "max_rate_rps": app.max_rate_rps, "latency_slo_ms": app.latency_slo_ms,
                   "variant": cluster.primary_variant(app).name} for app in apps)
    capacity = {key: float(value) for key, value in cluster.servers[0].capacity.items()}
    if not apps:
        capacity = machine_capacity(len(topology.servers))
        cluster = replace(cluster, servers=tuple(replace(server, capacity=Resources(capacity))
                                                 for server in cluster.servers))
    return Workload(cluster=cluster, specs=specs, capacity=capacity)


def machine_capacity(servers: int) -> dict[str, float]:
    """What each of ``servers`` testbed servers sharing this machine really has.

    An equal share of the machine's physical memory for models, and the compute of one
    reference accelerator each (the profiles' compute unit: the testbed's servers are
    processes on one host, none of them slower than the profiles assume).
    """
    if servers < 1:
        raise ValueError("need at least one server")
    total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    return {"memory_mb": float(total_mb / servers), "compute": 100.0}


def wait_for_servers(http: httpx.Client, count: int, timeout_s: float,
                     interval_s: float = 0.5) -> None:
    """Wait until ``count`` servers are up and connected (placement needs them all).

    A refused credential (401, 403) fails at once: waiting would not change it.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            servers = list_all(http, "/v1/servers")
            up = sum(1 for s in servers if s["state"] == "up" and s["connected"])
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code in (401, 403):
                raise RegistrationError(f"the controller refused the credential: "
                                        f"{exc.response.status_code} "
                                        f"{exc.response.text[:200]}") from exc
            up = 0
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            up = 0
        if up >= count:
            return
        if time.monotonic() > deadline:
            raise RegistrationError(f"timed out after {timeout_s:.0f} s waiting for {count} "
                                    f"servers to connect ({up} up)")
        time.sleep(interval_s)


def register_apps(http: httpx.Client, specs: tuple[dict[str, Any], ...] | list[dict[str, Any]],
                  load_timeout_s: float = 300.0) -> list[str]:
    """Register ``specs`` in order, each waiting until it serves; returns the ids registered now.

    Idempotent: an app already registered with the same spec is skipped (a re-run of the
    compose ``register`` job after a restart), one registered with another spec is an error.
    """
    created = []
    for spec in specs:
        response = http.post("/v1/apps", json=spec, params={"wait": "true"},
                             timeout=load_timeout_s)
        if response.status_code == 409:
            _check_existing(http, spec)
            logger.info("app %s was already registered with this spec", spec["app_id"])
            continue
        if response.status_code != 201:
            raise RegistrationError(f"registering {spec['app_id']}: {response.status_code} "
                                    f"{response.text}")
        created.append(spec["app_id"])
        logger.info("registered %s (%s, %s)", spec["app_id"], spec["variant"],
                    "critical" if spec["critical"] else "not critical")
    return created


def register_batch(http: httpx.Client,
                   specs: tuple[dict[str, Any], ...] | list[dict[str, Any]],
                   timeout_s: float = 60.0) -> list[str]:
    """Register ``specs`` with one ``POST /v1/apps/batch``; returns the ids registered now.

    The controller places the batch's primaries in order on one snapshot before any warm
    backup is planned: registered one by one, the warm backups of the first apps took the
    headroom the last ones needed, and those stayed unavailable. Idempotent as
    :func:`register_apps`: a conflict with the same spec is skipped, another spec is an error.
    """
    if not specs:
        return []
    response = http.post("/v1/apps/batch", json={"apps": list(specs)}, timeout=timeout_s)
    if response.status_code != 200:
        raise RegistrationError(f"registering {len(specs)} apps: {response.status_code} "
                                f"{response.text}")
    created = []
    for spec, result in zip(specs, response.json()["results"], strict=True):
        if result["outcome"] == "created":
            created.append(spec["app_id"])
        else:
            _check_existing(http, spec)
    logger.info("registered %d apps in one batch (%d already there)", len(created),
                len(specs) - len(created))
    return created


def _check_existing(http: httpx.Client, spec: dict[str, Any]) -> None:
    response = http.get(f"/v1/apps/{spec['app_id']}")
    if response.status_code != 200:
        raise RegistrationError(f"{spec['app_id']} conflicts but cannot be read: "
                                f"{response.status_code} {response.text}")
    existing = response.json()["spec"]
    different = {key: (existing.get(key), value) for key, value in spec.items()
                 if existing.get(key) != value}
    if different:
        raise RegistrationError(f"{spec['app_id']} is registered with another spec "
                                f"(field: (registered, wanted)): {different}")


def convergence_gaps(http: httpx.Client) -> list[str]:
    """What keeps the cluster from converging; empty when it has converged.

    Apps not serving their home variant, replicas not ready, planned warm backups missing or
    unplanned ones present.
    """
    try:
        apps = list_all(http, "/v1/apps")
        plan = http.get("/v1/plan")
    except (httpx.HTTPError, ValueError) as exc:
        return [f"controller unreachable: {exc}"]
    gaps = [f"{a['app_id']} is {a['status']}" for a in apps
            if a["status"] not in ("serving", "unavailable")]
    gaps += [f"{a['app_id']}/{r['variant']} on {r['server_id']} ({r['role']}) is {r['state']}"
             for a in apps for r in a["replicas"] if r["state"] != "ready"]
    if plan.status_code != 200:
        gaps += [f"{a['app_id']} is critical and no warm plan exists" for a in apps
                 if a["spec"]["critical"]]
        return gaps
    planned = {(p["app_id"], p["server_id"], p["variant"]) for p in plan.json()["assignments"]}
    present = {(a["app_id"], b["server_id"], b["variant"]) for a in apps for b in a["backups"]}
    gaps += [f"planned backup {a}/{v} on {s} is missing" for a, s, v in sorted(planned - present)]
    gaps += [f"backup {a}/{v} on {s} is not in the plan" for a, s, v in sorted(present - planned)]
    return gaps


def converged(http: httpx.Client) -> bool:
    """Whether every app serves its home variant and every planned warm backup is ready."""
    return not convergence_gaps(http)


def wait_converged(http: httpx.Client, timeout_s: float, interval_s: float = 0.25) -> None:
    """Wait until :func:`converged`; RegistrationError (saying what is left) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while gaps := convergence_gaps(http):
        if time.monotonic() > deadline:
            raise RegistrationError(f"timed out after {timeout_s:.0f} s waiting for apps and "
                                    f"warm backups to converge: {'; '.join(gaps[:8])}")
        time.sleep(interval_s)
