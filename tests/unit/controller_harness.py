"""A small cluster and the controller's core wired on the fakes of ``tests/unit/fakes.py``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller.executor import Executor
from controller.lifecycle import ServerLifecycle
from controller.metrics import Metrics
from controller.orchestrator import Orchestrator
from controller.prefetch import InterimPrefetcher
from controller.records import (
    AppRecord,
    AppSpec,
    AppStatus,
    Replica,
    RuntimeConfig,
    ServerRecord,
    ServerState,
)
from controller.returns import ServerReturns
from controller.warm_plan import WarmPlanner
from policies.model import Family, Role
from tests.unit.builders import make_family
from tests.unit.fakes import (
    CollectingSink,
    FakeAgents,
    FakeStore,
    FakeWatch,
    ManualClock,
    NoManifests,
    Timeline,
    endpoints_of,
)
from understudy.wire.protocol import ModelState

FAMILY = "f"
SMALL, MEDIUM, LARGE = "f_small", "f_medium", "f_large"
MEMORY = {SMALL: 100.0, MEDIUM: 200.0, LARGE: 400.0}
ACCURACY = {SMALL: 0.6, MEDIUM: 0.8, LARGE: 1.0}


def families() -> dict[str, Family]:
    """One family of three variants: 100/200/400 MB, accuracy 0.6/0.8/1.0, no compute."""
    family = make_family(FAMILY, [(v, MEMORY[v], ACCURACY[v]) for v in (SMALL, MEDIUM, LARGE)])
    return {FAMILY: family}


SITES = {"s1": "site-a", "s2": "site-a", "s3": "site-b", "s4": "site-c"}
"""Four servers on three sites."""


def server_record(server_id: str, memory_mb: float = 1000.0,
                  state: ServerState = ServerState.UP) -> ServerRecord:
    endpoints = endpoints_of(server_id)
    return ServerRecord(server_id=server_id, site_id=SITES[server_id],
                        capacity={"memory_mb": memory_mb, "compute": 100.0},
                        http=endpoints.http, grpc=endpoints.grpc, state=state, connected=True,
                        boot_id="boot-" + server_id, last_hello=0.0)


def replica(server_id: str, variant: str, role: Role = Role.PRIMARY,
            state: ModelState = ModelState.READY) -> Replica:
    return Replica(server_id=server_id, variant=variant, role=role, state=state,
                   accuracy=ACCURACY[variant], since=0.0)


def app_record(app_id: str, replicas: list[Replica], *, serving: tuple[str, str] | None,
               home: tuple[str, str] | None = None, critical: bool = False,
               status: AppStatus = AppStatus.SERVING, **spec: Any) -> AppRecord:
    return AppRecord(spec=AppSpec(app_id=app_id, family=FAMILY, critical=critical, **spec),
                     status=status, replicas=replicas, serving=serving,
                     home=home if home is not None else serving, registered_at=0.0,
                     updated_at=0.0)


@dataclass
class Controller:
    """The controller's core on fakes, wired as ``controller.service.Controller.start`` does.

    One difference: a requested warm re-plan (``WarmPlanner.request``, debounced in the
    background) is only counted in ``replan_requests``; the test runs ``warm.replan()``
    itself when it wants one (a failover still re-plans as its last step, as in production).
    """

    store: FakeStore
    agents: FakeAgents
    sink: CollectingSink
    watch: FakeWatch
    clock: ManualClock
    executor: Executor
    orchestrator: Orchestrator
    warm: WarmPlanner
    returns: ServerReturns
    lifecycle: ServerLifecycle
    prefetcher: InterimPrefetcher
    replan_requests: list[str]


def build_controller(store: FakeStore, agents: FakeAgents, clock: ManualClock,
                     config: RuntimeConfig | None = None,
                     family_map: Mapping[str, Family] | None = None,
                     sink: CollectingSink | None = None) -> Controller:
    """A controller on ``store`` and ``agents`` (call again on the same store: a restart)."""
    fams = dict(family_map) if family_map is not None else families()
    sink = sink if sink is not None else CollectingSink(agents.timeline)
    watch = FakeWatch()
    metrics = Metrics()
    artifacts = NoManifests()
    requests: list[str] = []
    executor = Executor(store, agents, sink, metrics, artifacts, clock,
                        on_serving_moved=lambda: requests.append("serving moved"))
    prefetcher = InterimPrefetcher(store, agents, artifacts, fams, executor.spawn)
    orchestrator = Orchestrator(executor, store, fams, config or RuntimeConfig(), clock,
                                on_registered=prefetcher.request)
    warm = WarmPlanner(executor, store, fams, lambda: orchestrator.config,
                       orchestrator.policy, metrics, clock)
    returns = ServerReturns(
        executor, store, agents, watch, fams, metrics,
        failback=lambda: orchestrator.config.failback,
        place_unplaced=orchestrator.place_unplaced,
        server_joined=prefetcher.server_joined,
        request_warm_replan=lambda: requests.append("return"))
    lifecycle = ServerLifecycle(executor, store, agents, watch, fams, orchestrator.policy,
                                metrics, clock, warm.replan, returns)
    return Controller(store, agents, sink, watch, clock, executor, orchestrator, warm,
                      returns, lifecycle, prefetcher, requests)


def seed(store: FakeStore, agents: FakeAgents, apps: Iterable[AppRecord],
         servers: Iterable[str] = ("s1", "s2", "s3", "s4"), memory_mb: float = 1000.0) -> None:
    """Write servers and apps to the store; every server holds what the records say is READY."""
    for server_id in servers:
        store.put_server_now(server_record(server_id, memory_mb))
        agents.connect(server_id)
    for record in apps:
        store.put_app_now(record)
        for r in record.replicas:
            if r.state is ModelState.READY:
                agents.connect(r.server_id, [(record.app_id, r.variant)])


def new_cluster(apps: Iterable[AppRecord] = (), *,
                servers: Iterable[str] = ("s1", "s2", "s3", "s4"), memory_mb: float = 1000.0,
                auto_load: bool = False, auto_unload: bool = True) -> Controller:
    """A controller on a fresh store and agents (one timeline), seeded with ``apps``."""
    clock = ManualClock()
    timeline = Timeline()
    store = FakeStore(clock, timeline)
    agents = FakeAgents(timeline, auto_load=auto_load, auto_unload=auto_unload)
    seed(store, agents, apps, servers=servers, memory_mb=memory_mb)
    return build_controller(store, agents, clock)
