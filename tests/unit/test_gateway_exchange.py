"""One request's attempts: cancel and resend on a move, wait on failure, hedging (fake replicas)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.board import RouteBoard
from gateway.errors import (
    AppDeletedError,
    DeadlineError,
    StoppingError,
    UnavailableError,
    UnknownAppError,
)
from gateway.exchange import Answer, Dispatcher, InferRequest, failure_of
from gateway.routes import RoutingTable
from gateway.upstream import UpstreamError, UpstreamReply
from tests.unit.scenario import run
from tests.unit.test_gateway_routes import event
from understudy.client import Location

UNKNOWN_MODEL = b'{"error":"Request for unknown model: \'a__v_large\' is not found"}'


class FakeReplicas:
    """Replicas by server id: each answers, refuses, hangs, or says the model is unknown."""

    def __init__(self) -> None:
        self.mode: dict[str, str] = {}
        self.calls: list[str] = []
        self.cancelled: list[str] = []
        self.started: dict[str, asyncio.Event] = {}

    def started_on(self, server: str) -> asyncio.Event:
        return self.started.setdefault(server, asyncio.Event())

    async def send(self, route: Location, request: InferRequest) -> UpstreamReply:
        server = route.server_id
        self.calls.append(server)
        self.started_on(server).set()
        mode = self.mode.get(server, "ok")
        if mode == "refuse":
            raise UpstreamError(f"cannot connect to {route.http}")
        if mode == "hang":
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.append(server)
                raise
        if mode == "slow":
            await asyncio.sleep(0.05)
        if mode == "unknown":
            return UpstreamReply(400, {}, UNKNOWN_MODEL)
        if mode == "bad":
            return UpstreamReply(400, {}, b'{"error":"unexpected shape for input \'image\'"}')
        return UpstreamReply(200, {"content-type": "application/json"},
                             b'{"model_name":"' + route.model_name.encode() + b'"}')


class Recorder:
    def __init__(self) -> None:
        self.resends: list[tuple[str, str]] = []
        self.hedges: list[str] = []

    def resent(self, app_id: str, cause: str) -> None:
        self.resends.append((app_id, cause))

    def hedged(self, app_id: str) -> None:
        self.hedges.append(app_id)


def setup(*events: dict[str, Any], hedge_s: float | None = None
          ) -> tuple[RouteBoard, FakeReplicas, Recorder, Dispatcher]:
    table = RoutingTable()
    for e in events:
        table.apply(e)
    board = RouteBoard(table)
    replicas, recorder = FakeReplicas(), Recorder()
    dispatcher = Dispatcher(board, {"http": replicas.send}, retry_min_s=0.01, retry_max_s=0.05,
                            hedge_s={"a": hedge_s} if hedge_s is not None else None,
                            events=recorder)
    return board, replicas, recorder, dispatcher


def request(timeout_s: float = 5.0, app: str = "a") -> InferRequest:
    return InferRequest(app, asyncio.get_running_loop().time() + timeout_s, b"{}")


def test_a_request_goes_to_the_serving_replica() -> None:
    async def scenario() -> Answer:
        _, replicas, recorder, dispatcher = setup(event(1, "a", "serving", "s1"))
        answer = await dispatcher.send(request())
        assert replicas.calls == ["s1"] and recorder.resends == []
        return answer

    answer = run(scenario)
    assert answer.reply.status == 200 and answer.route.server_id == "s1"
    assert (answer.attempts, answer.resends, answer.hedged) == (1, 0, False)


def test_a_move_cancels_the_attempt_in_flight_and_resends_at_once() -> None:
    async def scenario() -> None:
        board, replicas, recorder, dispatcher = setup(event(1, "a", "serving", "s1"))
        replicas.mode["s1"] = "hang"  # a server that stopped answering
        pending = asyncio.create_task(dispatcher.send(request()))
        await replicas.started_on("s1").wait()
        board.apply(event(2, "a", "warm_switch", "s2", "v_small", failed_server="s1"))
        answer = await pending
        assert answer.route.server_id == "s2" and answer.resends == 1
        assert replicas.cancelled == ["s1"] and replicas.calls == ["s1", "s2"]
        assert recorder.resends == [("a", "moved")]

    run(scenario)


def test_a_move_in_the_loop_pass_of_the_answer_does_not_cancel_what_follows() -> None:
    """The reply and the app's move come in one loop pass: the request has its answer, and
    what its task awaits next (writing the answer to the client) is not cancelled."""
    async def scenario() -> Answer:
        board, _, _, dispatcher = setup(event(1, "a", "serving", "s1"))
        reply_due: asyncio.Future[UpstreamReply] = asyncio.get_running_loop().create_future()

        async def send(route: Location, request: InferRequest) -> UpstreamReply:
            return await reply_due

        dispatcher.senders["http"] = send

        async def client() -> Answer:
            answer = await dispatcher.send(request())
            await asyncio.sleep(0.01)  # the request's task goes on: the answer is written
            return answer

        task = asyncio.create_task(client())
        await asyncio.sleep(0)  # the attempt is on its way
        reply_due.set_result(UpstreamReply(200, {}, b'{"model_name":"a__v_large"}'))
        board.apply(event(2, "a", "warm_switch", "s2", "v_small", failed_server="s1"))
        return await task

    answer = run(scenario)
    assert answer.route.server_id == "s1" and answer.reply.status == 200


def test_a_failed_attempt_waits_for_the_next_move_and_goes_there() -> None:
    async def scenario() -> None:
        board, replicas, recorder, dispatcher = setup(event(1, "a", "serving", "s1"))
        replicas.mode["s1"] = "refuse"
        pending = asyncio.create_task(dispatcher.send(request()))
        await replicas.started_on("s1").wait()
        await asyncio.sleep(0.03)  # a few back-off retries at the dead server
        assert not pending.done()
        board.apply(event(2, "a", "interim_serving", "s2", "v_tiny", failed_server="s1"))
        answer = await pending
        assert answer.route.server_id == "s2" and answer.reply.status == 200
        assert replicas.calls[0] == "s1" and replicas.calls[-1] == "s2"
        assert all(cause == "failed" for _, cause in recorder.resends)

    run(scenario)


def test_an_unknown_model_is_retried_like_a_dead_server() -> None:
    async def scenario() -> None:
        board, replicas, _, dispatcher = setup(event(1, "a", "serving", "s1"))
        replicas.mode["s1"] = "unknown"  # unloaded there just before the move is announced
        pending = asyncio.create_task(dispatcher.send(request()))
        await replicas.started_on("s1").wait()
        board.apply(event(2, "a", "serving", "s2"))
        assert (await pending).route.server_id == "s2"

    run(scenario)


def test_without_news_the_same_replica_is_tried_again_after_a_back_off() -> None:
    """The controller may be down: a replica that comes back is found without an event."""

    async def scenario() -> Answer:
        _, replicas, _, dispatcher = setup(event(1, "a", "serving", "s1"))
        replicas.mode["s1"] = "refuse"
        pending = asyncio.create_task(dispatcher.send(request()))
        await asyncio.sleep(0.1)
        replicas.mode["s1"] = "ok"
        answer = await pending
        assert 3 <= len(replicas.calls) <= 12  # backed off (10, 20, 40, 50 ms ...), not spun
        return answer

    assert run(scenario).route.server_id == "s1"


def test_a_final_error_is_the_answer_and_is_not_retried() -> None:
    async def scenario() -> Answer:
        _, replicas, _, dispatcher = setup(event(1, "a", "serving", "s1"))
        replicas.mode["s1"] = "bad"
        answer = await dispatcher.send(request())
        assert replicas.calls == ["s1"]
        return answer

    assert run(scenario).reply.status == 400


def test_the_deadline_ends_a_request_with_its_reason() -> None:
    async def nowhere() -> None:
        _, _, _, dispatcher = setup(event(1, "a", "unrecoverable", reason="no room"))
        with pytest.raises(UnavailableError, match="no room"):
            await dispatcher.send(request(0.05))

    async def dead() -> None:
        _, replicas, _, dispatcher = setup(event(1, "a", "serving", "s1"))
        replicas.mode["s1"] = "refuse"
        with pytest.raises(UnavailableError, match="cannot connect"):
            await dispatcher.send(request(0.05))

    async def hung() -> None:
        _, replicas, _, dispatcher = setup(event(1, "a", "serving", "s1"))
        replicas.mode["s1"] = "hang"
        with pytest.raises(DeadlineError, match="no answer from s1"):
            await dispatcher.send(request(0.05))
        await asyncio.sleep(0)
        assert replicas.cancelled == ["s1"]  # nothing left running

    async def too_late() -> None:  # a replica, but the deadline passed before it could go
        _, replicas, _, dispatcher = setup(event(1, "a", "serving", "s1"))
        with pytest.raises(DeadlineError, match="passed before the request could be sent"):
            await dispatcher.send(request(-0.001))
        assert replicas.calls == []

    run(nowhere)
    run(dead)
    run(hung)
    run(too_late)


def test_unknown_and_deleted_apps() -> None:
    async def scenario() -> None:
        board, replicas, _, dispatcher = setup(event(1, "a", "serving", "s1"))
        with pytest.raises(UnknownAppError):
            await dispatcher.send(request(app="nope"))
        replicas.mode["s1"] = "hang"
        pending = asyncio.create_task(dispatcher.send(request()))
        await replicas.started_on("s1").wait()
        board.apply(event(2, "a", "deleted"))
        with pytest.raises(AppDeletedError):
            await pending

    run(scenario)


def test_a_hedge_goes_to_the_warm_backup_and_the_first_answer_wins() -> None:
    async def scenario() -> None:
        _, replicas, recorder, dispatcher = setup(
            event(1, "a", "serving", "s1"),
            event(2, "a", "backup_ready", "s2", "v_small", role="warm"), hedge_s=0.02)
        replicas.mode["s1"] = "hang"
        answer = await dispatcher.send(request())
        assert answer.route.server_id == "s2" and answer.hedged and answer.hedge_won
        await asyncio.sleep(0)
        assert replicas.cancelled == ["s1"] and recorder.hedges == ["a"]

    run(scenario)


def test_no_hedge_before_its_delay() -> None:
    async def scenario() -> None:
        _, replicas, recorder, dispatcher = setup(
            event(1, "a", "serving", "s1"),
            event(2, "a", "backup_ready", "s2", "v_small", role="warm"), hedge_s=1.0)
        replicas.mode["s1"] = "slow"
        answer = await dispatcher.send(request())
        assert answer.route.server_id == "s1" and not answer.hedged
        assert replicas.calls == ["s1"] and recorder.hedges == []

    run(scenario)


def test_a_hedge_on_the_server_the_app_switches_to_is_kept() -> None:
    async def scenario() -> None:
        board, replicas, _, dispatcher = setup(
            event(1, "a", "serving", "s1"),
            event(2, "a", "backup_ready", "s2", "v_small", role="warm"), hedge_s=0.0)
        replicas.mode["s1"] = replicas.mode["s2"] = "hang"
        pending = asyncio.create_task(dispatcher.send(request()))
        await replicas.started_on("s2").wait()
        board.apply(event(3, "a", "warm_switch", "s2", "v_small", failed_server="s1"))
        await asyncio.sleep(0.01)
        replicas.mode["s2"] = "ok"
        assert replicas.cancelled == ["s1"] and replicas.calls == ["s1", "s2"]
        pending.cancel()

    run(scenario)


def test_stopping_fails_waiting_requests_with_a_reason() -> None:
    async def scenario() -> None:
        _, replicas, _, dispatcher = setup(event(1, "a", "serving", "s1"))
        replicas.mode["s1"] = "hang"
        pending = asyncio.create_task(dispatcher.send(request()))
        await replicas.started_on("s1").wait()
        dispatcher.stop()
        with pytest.raises(StoppingError):
            await pending
        with pytest.raises(StoppingError):
            await dispatcher.send(request())

    run(scenario)


def test_requests_wait_for_a_first_table() -> None:
    async def scenario() -> None:
        board = RouteBoard()
        replicas = FakeReplicas()
        dispatcher = Dispatcher(board, {"http": replicas.send})
        with pytest.raises(UnavailableError, match="no routing table"):
            await dispatcher.send(request(0.02))
        pending = asyncio.create_task(dispatcher.send(request()))
        await asyncio.sleep(0.01)
        board.apply_snapshot([{"app_id": "a", "serving": {
            "server_id": "s1", "variant": "v", "accuracy": 1.0, "model_name": "a__v",
            "endpoint": {"http": "h:1", "grpc": "g:1"}}}], {})
        assert (await pending).route.server_id == "s1"

    async def stopped() -> None:
        dispatcher = Dispatcher(RouteBoard(), {"http": FakeReplicas().send})
        pending = asyncio.create_task(dispatcher.send(request()))
        await asyncio.sleep(0.01)
        dispatcher.stop()  # nothing to route with, and stopping: still an answer
        with pytest.raises(StoppingError):
            await pending

    run(scenario)
    run(stopped)


@pytest.mark.parametrize(("status", "body", "retry"), [
    (200, b"{}", False), (400, UNKNOWN_MODEL, True), (400, b'{"error":"bad shape"}', False),
    (503, b"", True), (404, b"", True), (500, b'{"error":"boom"}', False),
    (400, b'{"error":"Model \'a__v\' is not ready"}', True)])
def test_which_replies_call_for_another_try(status: int, body: bytes, retry: bool) -> None:
    assert (failure_of(UpstreamReply(status, {}, body)) is not None) is retry
