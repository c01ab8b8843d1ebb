"""The SDK's calls across failovers: cancel and resend on a move, wait on failure, deadlines,
closing (fake routes and replicas)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from tests.unit.scenario import run
from tests.unit.sdk_fakes import FakeReplicas, FakeRoutes, loc
from understudy.sdk import (
    AppDeletedError,
    AsyncClient,
    Client,
    ClosedError,
    DeadlineError,
    InferenceError,
    RequestRecord,
    UnavailableError,
    UnknownAppError,
)

X = {"x": np.arange(4, dtype=np.int64).reshape(2, 2)}


def setup(**known: Any) -> tuple[FakeRoutes, FakeReplicas, AsyncClient, list[RequestRecord]]:
    routes = FakeRoutes(known or {"a": loc("s1")})
    replicas = FakeReplicas()
    records: list[RequestRecord] = []
    client = AsyncClient(routes=routes, transport=replicas, on_record=records.append,
                         timeout_s=5.0)
    return routes, replicas, client, records


def test_an_answer_is_stamped_with_the_replica_that_gave_it() -> None:
    async def scenario() -> None:
        _, replicas, client, records = setup()
        result = await client.infer("a", X)
        assert np.array_equal(result["x_out"], X["x"] + 1)
        assert result.model_name == "a__v"
        record = result.record
        assert record.ok and record.server_id == "s1" and record.variant == "v"
        assert record.attempts == 1 and record.resends == 0 and record.moved == 0
        assert record.app_id == "a" and record.protocol == "fake"
        assert record.sent_at <= record.done_at
        assert records == [record]
        await client.close()
        assert replicas.closed

    run(scenario)


def test_a_move_cancels_the_attempt_in_flight_and_resends_it_at_once() -> None:
    async def scenario() -> None:
        routes, replicas, client, _ = setup()
        replicas.mode["s1"] = "hang"
        call = asyncio.ensure_future(client.infer("a", X))
        await replicas.started_on("s1").wait()
        routes.move("a", loc("s2", "w"))
        result = await call
        assert replicas.cancelled == ["s1"]
        assert result.record.server_id == "s2" and result.record.variant == "w"
        assert result.record.moved == 1 and result.record.resends == 1
        assert result.record.attempts == 2
        await client.close()

    run(scenario)


def test_a_move_on_the_same_server_lets_the_attempt_run() -> None:
    async def scenario() -> None:
        routes, replicas, client, _ = setup()
        replicas.mode["s1"] = "hang"
        call = asyncio.ensure_future(client.infer("a", X))
        await replicas.started_on("s1").wait()
        routes.move("a", loc("s1", "upgraded"))  # another variant, same server
        await asyncio.sleep(0.05)
        assert not replicas.cancelled and not call.done()
        replicas.mode["s1"] = "ok"
        routes.move("a", None)  # served nowhere: nothing better to go to
        await asyncio.sleep(0.05)
        assert not replicas.cancelled
        call.cancel()
        await client.close()

    run(scenario)


def test_a_failed_attempt_waits_for_the_next_move_instead_of_erroring() -> None:
    async def scenario() -> None:
        routes, replicas, client, _ = setup()
        replicas.mode["s1"] = "refuse"
        call = asyncio.ensure_future(client.infer("a", X))
        await replicas.started_on("s1").wait()
        await asyncio.sleep(0.2)  # retried after a back-off, not failed
        assert not call.done() and replicas.calls.count("s1") >= 2
        routes.move("a", loc("s2"))
        result = await call
        assert result.record.ok and result.record.server_id == "s2" and result.record.moved == 0
        await client.close()

    run(scenario)


def test_without_a_move_the_same_replica_is_tried_again_until_it_answers() -> None:
    async def scenario() -> None:
        _, replicas, client, _ = setup()
        replicas.mode["s1"] = "refuse"
        call = asyncio.ensure_future(client.infer("a", X))
        await replicas.started_on("s1").wait()
        while replicas.calls.count("s1") < 3:
            await asyncio.sleep(0.01)
        replicas.mode["s1"] = "ok"
        result = await call
        assert result.record.ok and result.record.attempts >= 3

    run(scenario)


def test_an_app_served_nowhere_is_answered_once_it_is_placed() -> None:
    async def scenario() -> None:
        routes, _, client, _ = setup(a=None)
        call = asyncio.ensure_future(client.infer("a", X))
        await asyncio.sleep(0.05)
        assert not call.done()
        routes.move("a", loc("s3"))
        assert (await call).record.server_id == "s3"

    run(scenario)


def test_no_answer_before_the_deadline_is_an_error_naming_the_last_failure() -> None:
    async def scenario() -> None:
        _, replicas, client, records = setup()
        replicas.mode["s1"] = "refuse"
        with pytest.raises(UnavailableError, match="connection refused") as raised:
            await client.infer("a", X, timeout_s=0.3)
        record = raised.value.record
        assert record is not None and not record.ok and record.reason == "unavailable"
        assert record.attempts >= 2 and records == [record]

    run(scenario)


def test_an_attempt_still_in_flight_at_the_deadline_is_a_deadline_error() -> None:
    async def scenario() -> None:
        _, replicas, client, _ = setup()
        replicas.mode["s1"] = "hang"
        with pytest.raises(DeadlineError, match="no answer from s1"):
            await client.infer("a", X, timeout_s=0.2)
        await asyncio.sleep(0.01)  # the cancelled attempt unwinds
        assert replicas.cancelled == ["s1"]

    run(scenario)


def test_a_bad_input_is_refused_at_once_and_not_resent() -> None:
    async def scenario() -> None:
        _, replicas, client, _ = setup()
        replicas.mode["s1"] = "bad"
        with pytest.raises(InferenceError, match="unexpected shape") as raised:
            await client.infer("a", X)
        assert raised.value.record is not None and raised.value.record.reason == "rejected"
        assert replicas.calls == ["s1"]

    run(scenario)


def test_unknown_and_deleted_apps_are_errors_that_say_so() -> None:
    async def scenario() -> None:
        routes, replicas, client, _ = setup()
        with pytest.raises(UnknownAppError, match="not registered"):
            await client.infer("nope", X)
        replicas.mode["s1"] = "hang"
        call = asyncio.ensure_future(client.infer("a", X))
        await replicas.started_on("s1").wait()
        routes.delete("a")
        with pytest.raises(AppDeletedError, match="deleted"):
            await call
        await asyncio.sleep(0.01)  # the cancelled attempt unwinds
        assert replicas.cancelled == ["s1"]

    run(scenario)


def test_closing_ends_every_waiting_call_with_a_reason() -> None:
    async def scenario() -> None:
        _, replicas, client, records = setup()
        replicas.mode["s1"] = "hang"
        calls = [asyncio.ensure_future(client.infer("a", X)) for _ in range(3)]
        await replicas.started_on("s1").wait()
        await client.close()
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(o, ClosedError) for o in outcomes), outcomes
        assert sorted(r.reason for r in records) == ["closed"] * 3
        with pytest.raises(ClosedError):
            await client.infer("a", X)

    run(scenario)


def test_metadata_and_readiness_go_to_the_serving_replica() -> None:
    async def scenario() -> None:
        routes, replicas, client, _ = setup()
        replicas.mode["s1"] = "refuse"
        call = asyncio.ensure_future(client.metadata("a"))
        await replicas.started_on("s1").wait()
        routes.move("a", loc("s2"))
        meta = await call
        assert meta.server_id == "s2" and meta.input("x").zeros(3).shape == (3, 2)
        assert await client.ready("a")
        assert not await client.ready("nope")
        replicas.mode["s2"] = "refuse"
        assert not await client.ready("a")

    run(scenario)


def test_the_blocking_client_serves_many_threads_and_closes_them_out() -> None:
    routes = FakeRoutes({"a": loc("s1")})
    replicas = FakeReplicas()
    client = Client(routes=routes, transport=replicas, timeout_s=30.0)
    answers = [client.infer("a", X) for _ in range(3)]
    assert all(a.record.server_id == "s1" for a in answers)
    replicas.mode["s1"] = "hang"
    outcomes: list[BaseException | None] = []

    def call() -> None:
        try:
            client.infer("a", X)
            outcomes.append(None)
        except BaseException as exc:  # noqa: BLE001 - the outcome is the finding
            outcomes.append(exc)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    while len(replicas.calls) < 3 + 4:
        threading.Event().wait(0.01)
    client.close()
    for thread in threads:
        thread.join(5)
    assert len(outcomes) == 4 and all(isinstance(o, ClosedError) for o in outcomes)
    with pytest.raises(ClosedError):
        client.infer("a", X)
    client.close()  # idempotent
