"""The per-app queue and its FIFO dispatch policy; the data plane's checks and renaming."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.board import RouteBoard
from gateway.config import GatewayConfig, valid_app_id
from gateway.dataplane import DataPlane, rename_infer_reply, rename_metadata
from gateway.errors import BadRequestError, DeadlineError, QueueFullError, UnknownAppError
from gateway.exchange import Answer, Dispatcher, InferRequest
from gateway.metrics import GatewayMetrics
from gateway.queue import AppQueue, FifoPolicy, Queues
from gateway.routes import RoutingTable
from gateway.upstream import UpstreamReply
from tests.unit.test_gateway_routes import event
from understudy.client import Location

ROUTE = Location("h:1", "g:1", "a__v", "s1", "v", 1.0, 1)


def answer() -> Answer:
    return Answer(UpstreamReply(200, {}, b"{}"), ROUTE, 1, 0, False, False)


def request(timeout_s: float = 5.0, app: str = "a") -> InferRequest:
    return InferRequest(app, asyncio.get_running_loop().time() + timeout_s, b"{}")


class Gate:
    """A send function whose calls wait until released, in the order they came."""

    def __init__(self) -> None:
        self.waiting: list[tuple[InferRequest, asyncio.Future[None]]] = []
        self.running = 0
        self.most = 0

    async def send(self, req: InferRequest) -> Answer:
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((req, future))
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await future
        finally:
            self.running -= 1
        return answer()

    def release(self) -> InferRequest:
        req, future = self.waiting.pop(0)
        future.set_result(None)
        return req


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_fifo_bounds_what_is_in_flight_and_keeps_arrival_order() -> None:
    async def scenario() -> None:
        gate = Gate()
        policy = FifoPolicy(max_in_flight=2, max_waiting=10)
        requests = [request() for _ in range(5)]
        tasks = [asyncio.create_task(policy.dispatch(r, gate.send)) for r in requests]
        await settle()
        assert gate.running == 2 and policy.waiting == 3
        sent = []
        while gate.waiting:
            sent.append(gate.release())
            await settle()
        await asyncio.gather(*tasks)
        assert sent == requests and gate.most == 2

    asyncio.run(scenario())


def test_a_full_queue_refuses_and_a_queued_request_keeps_its_deadline() -> None:
    async def scenario() -> None:
        gate = Gate()
        policy = FifoPolicy(max_in_flight=1, max_waiting=1)
        first = asyncio.create_task(policy.dispatch(request(), gate.send))
        second = asyncio.create_task(policy.dispatch(request(0.02), gate.send))
        await settle()
        with pytest.raises(QueueFullError):
            await policy.dispatch(request(), gate.send)
        with pytest.raises(DeadlineError, match="queue"):
            await second
        gate.release()
        await first
        assert policy.waiting == 0

    asyncio.run(scenario())


def test_the_queue_reports_every_request_to_its_observer() -> None:
    class Observer:
        def __init__(self) -> None:
            self.seen: list[tuple[str, str]] = []

        def answered(self, app_id: str, a: Answer, latency_s: float) -> None:
            self.seen.append((app_id, a.route.server_id))

        def failed(self, app_id: str, reason: str, latency_s: float) -> None:
            self.seen.append((app_id, reason))

    async def ok(_: InferRequest) -> Answer:
        return answer()

    async def refused(req: InferRequest) -> Answer:
        raise QueueFullError("full")

    async def scenario() -> list[tuple[str, str]]:
        observer = Observer()
        await AppQueue("a", FifoPolicy(), ok, observer).submit(request())
        with pytest.raises(QueueFullError):
            await AppQueue("a", FifoPolicy(), refused, observer).submit(request())
        return observer.seen

    assert asyncio.run(scenario()) == [("a", "s1"), ("a", "queue_full")]


def test_queues_are_made_per_app_with_the_policy_the_factory_gives() -> None:
    made: list[str] = []

    def policy_for(app_id: str) -> FifoPolicy:
        made.append(app_id)
        return FifoPolicy()

    async def send(_: InferRequest) -> Answer:
        return answer()

    queues = Queues(send, policy_for)
    assert queues.get("a") is queues.get("a")
    queues.get("b")
    queues.forget("a")
    queues.get("a")
    assert made == ["a", "b", "a"]


def test_metrics_count_answers_errors_resends_and_hedges() -> None:
    metrics = GatewayMetrics()
    hedged = Answer(UpstreamReply(200, {}, b""), ROUTE, 2, 0, True, True)
    metrics.answered("a", hedged, 0.003)
    metrics.failed("a", "unavailable", 1.0)
    metrics.resent("a", "moved")
    metrics.hedged("a")
    metrics.rejected("unknown_app")
    text = metrics.render().decode()
    for line in ('understudy_gateway_requests_total{app_id="a"} 2.0',
                 'understudy_gateway_answers_total{app_id="a",server_id="s1",variant="v"} 1.0',
                 'understudy_gateway_errors_total{app_id="a",reason="unavailable"} 1.0',
                 'understudy_gateway_resends_total{app_id="a",cause="moved"} 1.0',
                 'understudy_gateway_hedges_total{app_id="a",outcome="won"} 1.0',
                 'understudy_gateway_hedges_total{app_id="a",outcome="sent"} 1.0',
                 'understudy_gateway_errors_total{app_id="unknown",reason="unknown_app"} 1.0',
                 'understudy_gateway_latency_seconds_count{app_id="a"} 2.0'):
        assert line in text, line


# --- the data plane ------------------------------------------------------------------------

def plane(config: dict[str, Any] | None = None) -> DataPlane:
    table = RoutingTable()
    table.apply(event(1, "a", "serving", "s1"))
    board = RouteBoard(table)
    gateway = GatewayConfig(controller_url="http://c:1", **(config or {}))

    async def never(route: Location, req: InferRequest) -> UpstreamReply:
        raise AssertionError("not sent")

    dispatcher = Dispatcher(board, {"http": never})
    metrics = GatewayMetrics()
    return DataPlane(gateway, board, dispatcher, Queues(dispatcher.send, lambda _: FifoPolicy()),
                     metrics)


@pytest.mark.parametrize("value", ["nan", "inf", "-5", "0", "abc", "1e12"])
def test_a_bad_timeout_is_a_400(value: str) -> None:
    async def scenario() -> None:
        with pytest.raises(BadRequestError):
            plane().deadline(value)

    asyncio.run(scenario())


def test_timeouts_and_ids_that_are_accepted() -> None:
    async def scenario() -> None:
        p = plane({"default_deadline_s": 7.0})
        now = asyncio.get_running_loop().time()
        assert math.isclose(p.deadline(None) - now, 7.0, abs_tol=0.05)
        assert math.isclose(p.deadline("250") - now, 0.25, abs_tol=0.05)

    asyncio.run(scenario())
    assert valid_app_id("app-0001") and valid_app_id("A.b_c")
    for bad in ("", "a__b", "-a", "a/b", "x" * 64, "a b"):
        assert not valid_app_id(bad)
        with pytest.raises(BadRequestError):
            plane().check_app(bad)
    assert DataPlane.check_version("") == "" and DataPlane.check_version("3") == "3"
    for bad in ("x", "-1", "1" * 30):
        with pytest.raises(BadRequestError):
            DataPlane.check_version(bad)


def test_an_app_the_table_does_not_know_is_a_404() -> None:
    async def scenario() -> None:
        p = plane()
        with pytest.raises(UnknownAppError):
            await p.infer(request(app="nope"))
        assert p.in_flight == 0 and p.idle.is_set()

    asyncio.run(scenario())


def test_settings_are_validated() -> None:
    with pytest.raises(ValidationError):
        GatewayConfig(controller_url="ftp://x")
    with pytest.raises(ValidationError):
        GatewayConfig(controller_url="http://x", hedge_ms={"a": -1.0})
    with pytest.raises(ValidationError):
        GatewayConfig(controller_url="http://x", hedge_ms={"a__b": 5.0})
    with pytest.raises(ValidationError):
        GatewayConfig(controller_url="http://x", surprise=1)
    assert GatewayConfig(controller_url="http://x", max_body_mb=1).max_body_bytes == 1 << 20


def test_the_infer_reply_names_the_app_and_keeps_its_binary_part() -> None:
    header = b'{"model_name":"a__v_large","model_version":"1","outputs":[{"name":"logits"}]}'
    binary = bytes(range(256)) * 4
    renamed = rename_infer_reply(header + binary, "a__v_large", "a", len(header))
    assert renamed.header_length is not None
    new_header = renamed.body[:renamed.header_length]
    assert json.loads(new_header)["model_name"] == "a"
    assert renamed.body[renamed.header_length:] == binary
    plain = rename_infer_reply(header, "a__v_large", "a", None)
    assert json.loads(plain.body)["model_name"] == "a" and plain.header_length is None
    other = rename_infer_reply(header, "b__v", "b", None)
    assert other.body == header  # not this model's reply: untouched


def test_metadata_names_the_app() -> None:
    body = json.dumps({"name": "a__v", "versions": ["1"], "inputs": []}).encode()
    assert json.loads(rename_metadata(body, "a"))["name"] == "a"
    config = json.dumps({"config": {"name": "a__v", "backend": "x"}}).encode()
    assert json.loads(rename_metadata(config, "a"))["config"]["name"] == "a"
    assert rename_metadata(b"not json", "a") == b"not json"
