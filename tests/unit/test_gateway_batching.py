"""Batch schedulers in the gateway's per-app queue, with a fake Triton model behind the exchange.

The fake model answers each row with its own input summed (so an answer shows whose rows it
carries), reports each row's execution time in ``exec_us`` when asked to (a dynamic model), and
takes the time a batch of its rows would: the longest row's time, plus a share per extra row.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from unittest import mock

import numpy as np
import pytest
from pydantic import ValidationError

from gateway.batch_wire import groups, read_member
from gateway.batching import BatchPolicy, BatchSettings
from gateway.board import RouteBoard
from gateway.calibration import REFRESH_EVERY, SCHEDULERS, Calibration, batch_sizes
from gateway.config import GatewayConfig
from gateway.errors import DroppedError, GatewayError
from gateway.exchange import Answer, Dispatcher, InferRequest
from gateway.metrics import GatewayMetrics
from gateway.queue import AppQueue
from gateway.routes import RoutingTable
from gateway.tensors import header_length_of, http_answer, read_http_reply, read_http_request
from gateway.upstream import UpstreamReply
from scheduling.baselines import ClipperLike, ClockworkLike, NexusLike, TritonBatcher
from scheduling.orloj import Orloj
from scheduling.planning import Planning, RefreshJob
from scheduling.profile import MIN_OVERHEAD_SAMPLES
from scheduling.types import UNREACHABLE, BatchLaw
from tests.unit.scenario import run
from tests.unit.test_gateway_parity import body, event
from tests.unit.test_gateway_queue import ROUTE
from understudy.client import Location

APP = "a"
SCENARIO_LIMIT_S = 20.0
"""A scenario's limit here: several warm a policy up through its probes first."""


class FakeModel:
    """A Triton model: ``exec_s(row)`` per row; a batch takes its longest row's time, scaled."""

    def __init__(self, exec_s: Callable[[float], float] = lambda x: 0.004, slope: float = 0.2,
                 report: bool = False, unreported_s: float = 0.0) -> None:
        self.exec_s, self.slope, self.report = exec_s, slope, report
        self.unreported_s = unreported_s
        """Time a request takes beyond what the model reports (transfer, the server)."""
        self.overstated_s = 0.0
        """Added to the reported times only (a model measuring itself on another clock)."""
        self.batches: list[int] = []
        self.sent_as: list[str] = []
        """The app each Triton request was sent as."""
        self.busy = 0
        self.most_busy = 0
        self.hold: asyncio.Event | None = None

    async def reply(self, request: InferRequest, route: Location = ROUTE) -> UpstreamReply:
        query = read_http_request(request.body, header_length_of(request.headers))
        x = query.inputs["image"]
        rows = x.reshape(x.shape[0], -1).sum(axis=1)
        self.batches.append(len(rows))
        self.sent_as.append(request.app_id)
        self.busy += 1
        self.most_busy = max(self.most_busy, self.busy)
        try:
            times = np.array([self.exec_s(float(v)) for v in rows])
            await asyncio.sleep(float(times.max()) * (1 + self.slope * (len(rows) - 1))
                                + self.unreported_s)
            if self.hold is not None:
                await self.hold.wait()
        finally:
            self.busy -= 1
        outputs = {"logits": rows.astype(np.float32).reshape(-1, 1)}
        if self.report:
            # from the batch's start to the row's exit: slowed by the rows beside it
            scaled = times * (1 + self.slope * (len(rows) - 1)) + self.overstated_s
            outputs["exec_us"] = (scaled * 1e6).astype(np.float32).reshape(-1, 1)
        data, header = http_answer(query, outputs, route.model_name, "model")
        headers = {"content-type": "application/json"}
        if header is not None:
            headers["inference-header-content-length"] = str(header)
        return UpstreamReply(200, headers, data)

    async def send(self, request: InferRequest) -> Answer:
        return Answer(await self.reply(request), ROUTE, 1, 0, False, False)


class Events:
    def __init__(self) -> None:
        self.decisions: list[tuple[str, float, int]] = []
        self.drops: list[tuple[str, str]] = []
        self.overheads: list[float] = []
        self.refreshes: list[str] = []

    def decided(self, app_id: str, scheduler: str, cpu_s: float, batch_size: int) -> None:
        self.decisions.append((scheduler, cpu_s, batch_size))

    def dropped(self, app_id: str, scheduler: str, reason: str) -> None:
        self.drops.append((scheduler, reason))

    def batch_overhead(self, queue_id: str, seconds: float) -> None:
        self.overheads.append(seconds)

    def profile_refreshed(self, queue_id: str, outcome: str) -> None:
        self.refreshes.append(outcome)


def make_request(value: float, timeout_s: float = 5.0, app_id: str = APP) -> InferRequest:
    x = np.full((1, 1, 2, 2), value / 4, dtype=np.float32)
    data, headers = body(x, binary=value > 50)
    return InferRequest(app_id, asyncio.get_running_loop().time() + timeout_s, data, headers)


def value_of(answer: Answer) -> float:
    length = answer.reply.headers.get("inference-header-content-length")
    return float(read_http_reply(answer.reply.body, int(length) if length else None)[
        "logits"].ravel()[0])


def policy(name: str, slo_ms: float | None = 200.0, warmup: int = 4,
           events: Events | None = None, max_batch: int = 8) -> BatchPolicy:
    return BatchPolicy(APP, BatchSettings(name, max_batch, "exec_us", warmup),
                       lambda app_id: slo_ms, events=events)


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.001)


async def warm_up(p: BatchPolicy, model: FakeModel, count: int = 4) -> None:
    for i in range(count):
        await p.dispatch(make_request(i), model.send)
    await until(lambda: p.warm)  # the last probe is still out when the answer comes


# --- batches ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", SCHEDULERS)
def test_every_scheduler_batches_and_answers_each_request_with_its_own_rows(name: str) -> None:
    async def scenario() -> None:
        model = FakeModel()
        p = policy(name, slo_ms=400.0)
        await warm_up(p, model)
        model.batches.clear()
        values = [float(v) for v in range(10, 34)]  # some JSON, some binary
        answers = await asyncio.gather(*(p.dispatch(make_request(v), model.send)
                                         for v in values))
        assert [value_of(a) for a in answers] == pytest.approx(values)
        assert sum(model.batches) == len(values) and max(model.batches) > 1
        assert model.most_busy == 1  # one batch at a time on the app's worker
        assert max(model.batches) <= 8

    run(scenario, SCENARIO_LIMIT_S)


def test_the_warm_up_measures_solo_times_and_the_batch_law_from_probes() -> None:
    async def scenario() -> None:
        model = FakeModel(slope=0.5, report=True, exec_s=lambda x: 0.003 + 0.001 * (x % 3))
        p = policy("orloj", warmup=6)
        assert p.name == "warmup"
        await warm_up(p, model, 6)
        assert p.name == "orloj" and isinstance(p.scheduler, Orloj)
        assert set(p.calibration.probes) <= set(batch_sizes(8)[1:]) and p.calibration.probes
        law = p.profile.law  # type: ignore[union-attr]
        assert 0.2 < law.slope < 0.9  # the fake's 0.5, give or take the machine's jitter
        solo = p.profile.mix  # type: ignore[union-attr]
        assert solo.quantile(0.01) == pytest.approx(0.003, abs=2e-4)  # reported, not measured
        assert solo.quantile(0.99) == pytest.approx(0.005, abs=2e-4)
        assert not p.profile.per_batch  # type: ignore[union-attr]  # its times are its own
        static = policy("orloj", warmup=4)  # no reported times: a static model
        await warm_up(static, FakeModel(exec_s=lambda x: 0.003))
        assert static.calibration.static() and static.profile.per_batch  # type: ignore

    run(scenario, SCENARIO_LIMIT_S)


def test_reported_execution_times_feed_the_profile_after_the_warm_up() -> None:
    async def scenario() -> None:
        model = FakeModel(report=True, exec_s=lambda x: 0.002)
        p = policy("nexus", slo_ms=None, warmup=4)  # the requests' own timeouts
        await warm_up(p, model)
        assert p.slo_s == pytest.approx(5.0, abs=0.1)
        # the fake's own law: the warm-up's estimate of it moves with the machine's load
        assert p.profile is not None
        p.profile = dataclasses.replace(p.profile, law=BatchLaw(slope=model.slope))
        model.exec_s = lambda x: 0.006
        for _ in range(9):
            await asyncio.gather(*(p.dispatch(make_request(v), model.send) for v in range(30)))
        assert max(p.solo[APP]) == pytest.approx(0.006, rel=0.3)  # in-batch times scaled back
        assert isinstance(p.scheduler, NexusLike) and p.scheduler.solo_s > 0.003  # re-planned

    run(scenario, SCENARIO_LIMIT_S)


def test_each_batchs_overhead_beyond_the_reported_time_reaches_orlojs_profile() -> None:
    async def scenario() -> None:
        model = FakeModel(report=True, exec_s=lambda x: 0.002)
        events = Events()
        p = policy("orloj", slo_ms=500.0, warmup=4, events=events)
        await warm_up(p, model)
        assert isinstance(p.scheduler, Orloj) and p.scheduler.profile.overhead is None
        model.unreported_s = 0.004  # the machine gets loaded: the same model, slower answers
        for _ in range(MIN_OVERHEAD_SAMPLES):  # a batch at least each
            await asyncio.gather(*(p.dispatch(make_request(v), model.send) for v in range(2)))
        p.scheduler.refresh(p.clock())
        overhead = p.scheduler.profile.overhead
        assert overhead is not None  # a distribution of what the batches measured
        assert 0.004 <= overhead.quantile(0.5) < 0.004 + 0.004  # (sleeps run over, never short)
        assert p.scheduler.profile.batch_latency(1).mean() > 0.006
        assert len(events.overheads) >= MIN_OVERHEAD_SAMPLES  # and the metrics saw each
        assert min(events.overheads) >= 0.004
        model.overstated_s = 1.0  # reports more than the batch took: no negative overhead
        await asyncio.gather(*(p.dispatch(make_request(v), model.send) for v in range(2)))
        assert events.overheads[-1] == 0.0

    run(scenario, SCENARIO_LIMIT_S)


def test_orlojs_profile_refreshes_are_built_off_the_event_loop_and_installed_on_it() -> None:
    threads: list[str] = []

    async def scenario() -> None:
        model = FakeModel(report=True, exec_s=lambda x: 0.002)
        events = Events()
        refresher = ThreadPoolExecutor(1, thread_name_prefix="refresher")
        p = BatchPolicy(APP, BatchSettings("orloj", 8, "exec_us", 4), lambda app_id: 500.0,
                        events=events, refresher=refresher)
        await warm_up(p, model)
        # the fake's own law: the warm-up's estimate of it moves with the machine's load, and
        # the reported times are scaled back to solo times with it
        assert p.profile is not None
        p.profile = dataclasses.replace(p.profile, law=BatchLaw(slope=model.slope))
        orloj = p.scheduler
        assert isinstance(orloj, Orloj) and orloj.config.background_refresh
        first = orloj.planning
        build = RefreshJob.__call__

        def on_a_thread(job: RefreshJob) -> Planning | None:
            threads.append(threading.current_thread().name)
            return build(job)

        model.exec_s = lambda x: 0.008  # the model slows down: the refresh moves the profile
        with mock.patch.object(RefreshJob, "__call__", on_a_thread):
            while orloj.profiler.observations < REFRESH_EVERY:
                await asyncio.gather(*(p.dispatch(make_request(v), model.send)
                                       for v in range(16)))
            await until(lambda: bool(events.refreshes))
        assert events.refreshes == ["installed"]
        assert orloj.planning is not first
        assert orloj.profile.mix.quantile(0.5) == pytest.approx(0.008, rel=0.3)
        answers = await asyncio.gather(*(p.dispatch(make_request(v), model.send)
                                         for v in range(8)))  # and it plans with it
        assert [value_of(a) for a in answers] == pytest.approx(list(range(8)))
        refresher.shutdown()

    run(scenario, SCENARIO_LIMIT_S)
    assert threads and all(name.startswith("refresher") for name in threads)


def test_requests_that_cannot_stack_go_in_their_own_triton_request() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        small = read_member(1, make_request(1.0))
        wide_x = np.zeros((2, 1, 3, 3), dtype=np.float32)
        wide = read_member(2, InferRequest(APP, loop.time() + 1, *body(wide_x)))
        opaque = read_member(3, InferRequest(APP, loop.time() + 1, b"not json"))
        assert opaque.query is None and wide.rows == 2
        parts = groups([small, wide, opaque, read_member(4, make_request(2.0))], max_rows=8)
        assert [[m.key for m in g] for g in parts] == [[1, 4], [2], [3]]
        many = [read_member(i, make_request(float(i))) for i in range(10)]
        assert [len(g) for g in groups(many, max_rows=4)] == [4, 4, 2]

    run(scenario, SCENARIO_LIMIT_S)


# --- drops -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["orloj", "nexus", "clockwork"])
def test_a_hopeless_request_is_dropped_at_once_with_its_reason_and_counted(name: str) -> None:
    async def scenario() -> None:
        model = FakeModel(exec_s=lambda x: 0.02)
        events = Events()
        p = policy(name, slo_ms=5.0, events=events)  # a quarter of one request alone
        metrics = GatewayMetrics()
        queue = AppQueue(APP, p, model.send, metrics)
        for i in range(4):  # the warm-up sends them whatever the SLO
            try:
                await queue.submit(make_request(i))
            except GatewayError:
                pass
        await until(lambda: p.warm)
        model.batches.clear()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(DroppedError) as caught:
            await queue.submit(make_request(1.0))
        assert loop.time() - started < 0.02  # refused, not left to time out
        assert caught.value.reason == UNREACHABLE and "deadline-unreachable" in str(caught.value)
        assert caught.value.status == 504 and not model.batches
        assert (name, UNREACHABLE) in events.drops
        text = metrics.render().decode()
        assert f'understudy_gateway_errors_total{{app_id="a",reason="{UNREACHABLE}"}} 1.0' \
            in text

    run(scenario, SCENARIO_LIMIT_S)


def test_no_request_starves_under_a_steady_stream() -> None:
    """Requests keep coming faster than one at a time could serve; each is answered in time
    or dropped with a reason, none is left waiting past its deadline."""

    async def scenario() -> None:
        rng = np.random.default_rng(1)
        model = FakeModel(exec_s=lambda x: 0.002 if x % 2 else 0.006, report=True)
        p = policy("orloj", slo_ms=60.0)
        await warm_up(p, model)
        loop = asyncio.get_running_loop()
        outcomes: list[tuple[str, float]] = []

        async def one(value: float) -> None:
            started = loop.time()
            try:
                answer = await p.dispatch(make_request(value, timeout_s=0.2), model.send)
                assert value_of(answer) == pytest.approx(value)
                outcomes.append(("answered", loop.time() - started))
            except DroppedError as exc:
                outcomes.append((exc.reason, loop.time() - started))

        tasks = []
        for i in range(300):
            tasks.append(asyncio.create_task(one(float(i % 40))))
            await asyncio.sleep(float(rng.exponential(0.0015)))
        await asyncio.gather(*tasks)
        answered = [t for kind, t in outcomes if kind == "answered"]
        assert len(outcomes) == 300 and len(answered) > 250
        assert max(answered) < 0.2  # nobody waited until the client's own timeout
        assert max(model.batches) > 1 and not len(p.scheduler) and not p.waiting

    run(scenario, SCENARIO_LIMIT_S)


def test_a_client_that_goes_away_leaves_no_trace_in_the_batches() -> None:
    async def scenario() -> None:
        model = FakeModel()
        p = policy("clipper")
        await warm_up(p, model)
        model.hold = asyncio.Event()
        first = asyncio.create_task(p.dispatch(make_request(1.0), model.send))
        await asyncio.sleep(0.02)
        gone = asyncio.create_task(p.dispatch(make_request(2.0), model.send))
        kept = asyncio.create_task(p.dispatch(make_request(3.0), model.send))
        await asyncio.sleep(0.01)
        gone.cancel()
        model.hold.set()
        assert value_of(await first) == 1.0 and value_of(await kept) == 3.0
        assert model.batches[-1] == 1 and not p.waiting

    run(scenario, SCENARIO_LIMIT_S)


# --- selection and failover ------------------------------------------------------------------

def test_the_gateway_config_selects_each_scheduler_per_app_and_validates_it() -> None:
    from gateway.service import Gateway

    config = GatewayConfig(controller_url="http://127.0.0.1:1", scheduler={
        f"app{i}": name for i, name in enumerate(SCHEDULERS)} | {"plain": "none"},
        slo_ms={"app0": 25.0}, run_dir="/nonexistent/gw")
    gateway = Gateway(config)
    kinds = {ClipperLike: "clipper", NexusLike: "nexus", ClockworkLike: "clockwork",
             TritonBatcher: "triton", Orloj: "orloj"}
    for i, name in enumerate(SCHEDULERS):
        built = gateway._policy(f"app{i}")
        assert isinstance(built, BatchPolicy) and built.settings.scheduler == name
        from gateway.calibration import make_scheduler, profile_of

        made = make_scheduler(name, profile_of({"x": [0.01, 0.02]}, BatchLaw(0.1)), 0.1, 8)
        assert kinds[type(made)] == name.removesuffix("_paper")
        if isinstance(made, Orloj):  # ours: the three departures; the paper's: none
            ours = name == "orloj"
            assert made.config.request_aware is ours and made.config.partial_batches is ours
            assert made.config.selection == ("goodput" if ours else "earliest-deadline")
    assert gateway._slo_ms("app0") == 25.0 and gateway._slo_ms("app1") is None
    assert not isinstance(gateway._policy("plain"), BatchPolicy)
    for bad in ({"scheduler": {"a": "fifo"}}, {"slo_ms": {"a": 0.0}},
                {"slo_ms": {"a": float("nan")}}, {"scheduler": {"a__b": "orloj"}}):
        with pytest.raises(ValidationError):
            GatewayConfig(controller_url="http://127.0.0.1:1", **bad)


def test_the_registered_latency_slo_reaches_the_routing_table_and_survives_a_restart() -> None:
    table = RoutingTable()
    view = {"app_id": "a", "serving": None, "spec": {"latency_slo_ms": 40.0}}
    table.apply_snapshot([view, {"app_id": "b", "spec": {"latency_slo_ms": None}}], {})
    assert table.apps["a"].slo_ms == 40.0 and table.apps["b"].slo_ms is None
    assert RoutingTable.from_doc(table.to_doc()).apps["a"].slo_ms == 40.0


def test_a_batch_in_flight_follows_a_failover_to_the_new_replica() -> None:
    async def scenario() -> None:
        board = RouteBoard(RoutingTable())
        board.apply(event(1, APP, "serving", "s1", "v"))
        model = FakeModel()
        servers: list[str] = []

        async def send(route: Location, request: InferRequest) -> UpstreamReply:
            servers.append(route.server_id)
            if route.server_id == "s1":
                await asyncio.Event().wait()  # the server died with the batch
            return await model.reply(request, route)

        dispatcher = Dispatcher(board, {"http": send}, retry_min_s=0.01)
        p = policy("orloj", warmup=1)
        board.apply(event(2, APP, "warm_switch", "s2", "v"))
        await p.dispatch(make_request(0.0), dispatcher.send)  # the warm-up, on s2
        await until(lambda: p.warm)
        board.apply(event(3, APP, "warm_switch", "s1", "v"))
        tasks = [asyncio.create_task(p.dispatch(make_request(float(v)), dispatcher.send))
                 for v in range(1, 6)]
        await asyncio.sleep(0.05)
        assert servers[-1] == "s1" and not any(t.done() for t in tasks)
        board.apply(event(4, APP, "warm_switch", "s2", "v", failed_server="s1"))
        answers = await asyncio.gather(*tasks)
        assert [value_of(a) for a in answers] == [1.0, 2.0, 3.0, 4.0, 5.0]
        assert all(a.route.server_id == "s2" for a in answers)
        assert answers[0].resends >= 1 and servers[-1] == "s2"

    run(scenario, SCENARIO_LIMIT_S)


def test_the_calibration_reads_overhead_and_slope() -> None:
    c = Calibration(alone=[0.012, 0.013, 0.012], alone_exec=[0.010, 0.011, 0.010],
                    probes={2: [(0.0145, 0.012)], 4: [(0.0195, 0.012)]})
    law = c.law()
    assert law.overhead_s == pytest.approx(0.002)
    assert law.slope == pytest.approx(0.25)
    assert c.solo() == [0.010, 0.011, 0.010]
    static = Calibration(alone=[0.01, 0.01], probes={2: [(0.015, 0.01)]})
    assert static.law().overhead_s == 0.0 and static.law().slope == pytest.approx(0.5)
    assert static.solo() == [0.01, 0.01]


def test_latencies_are_measured_finer_than_uvloops_millisecond_loop_clock() -> None:
    """uvloop's ``loop.time()`` is whole milliseconds: a 0.4 ms model would read 0 or 1 ms."""
    uvloop = pytest.importorskip("uvloop")

    class Spinning(FakeModel):
        async def reply(self, request: InferRequest, route: Location = ROUTE) -> UpstreamReply:
            started = time.perf_counter()
            while time.perf_counter() - started < 0.0004:  # busy: the loop's clock stands still
                pass
            return await super().reply(request, route)

    async def scenario() -> BatchPolicy:
        p = policy("nexus", warmup=6)
        await warm_up(p, Spinning(exec_s=lambda x: 0.0), 6)
        return p

    p = uvloop.run(asyncio.wait_for(scenario(), 20))
    alone = sorted(p.calibration.alone)
    assert alone and alone[0] > 0.0003  # never read as the loop clock's 0 ms
    # the model's 0.4 ms, not a loop tick: the median (one run preempted on a busy machine
    # can take longer, which is the machine's, not the clock's)
    assert alone[len(alone) // 2] < 0.01
    assert any(abs(a * 1000 - round(a * 1000)) > 1e-6 for a in p.calibration.alone)
