"""Parity coding in the gateway, with fake instances: groups, timeouts, decodes, marks, baselines.

The fake model is linear without bias (F(x) = x W), for which F itself is an exact parity model
of the addition encoder: a reconstruction must then equal the prediction it replaces.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest

from gateway.board import RouteBoard
from gateway.coding import Coder, Group
from gateway.errors import DeadlineError
from gateway.exchange import Answer, InferRequest
from gateway.protection import ProtectedPolicy
from gateway.protection_modes import Protection, effective_mode, parity_coding
from gateway.queue import FifoPolicy
from gateway.routes import RoutingTable
from gateway.tensors import (
    ANSWER_PARAMETER,
    NotCodable,
    grpc_answer,
    header_length_of,
    http_answer,
    http_request,
    read_grpc_reply,
    read_grpc_request,
    read_http_reply,
    read_http_request,
)
from gateway.upstream import UpstreamError, UpstreamReply
from parity.coding import EncoderKind
from parity.naming import parse_parity_name
from tests.unit.scenario import run
from tests.unit.test_gateway_routes import ENDPOINTS
from tests.unit.test_gateway_routes import event as routes_event
from understudy.client import Location

MORE_SERVERS = {"s4": ("127.0.0.1:8004", "127.0.0.1:9004"),
                "s5": ("127.0.0.1:8005", "127.0.0.1:9005")}


def event(seq: int, app: str, kind: str, server: str | None = None, variant: str = "v_large",
          **extra: Any) -> dict[str, Any]:
    """A controller event (``test_gateway_routes.event``), on servers s1 to s5."""
    if server not in MORE_SERVERS:
        return routes_event(seq, app, kind, server, variant, **extra)
    doc = routes_event(seq, app, kind, "s1", variant, **extra)
    http, grpc = MORE_SERVERS[server]
    doc.update(server_id=server)
    if doc.get("endpoint") is not None:
        doc.update(endpoint={"http": http, "grpc": grpc})
    return doc


assert not set(MORE_SERVERS) & set(ENDPOINTS)
W = np.arange(12, dtype=np.float32).reshape(4, 3) / 10.0
APP = "a"


def model(x: np.ndarray) -> np.ndarray:
    return (x.reshape(x.shape[0], -1) @ W).astype(np.float32)


def body(x: np.ndarray, binary: bool = False) -> tuple[bytes, tuple[tuple[str, str], ...]]:
    if binary:
        data, length = http_request({"image": x})
        return data, (("content-type", "application/octet-stream"),
                      ("inference-header-content-length", str(length)))
    doc = {"inputs": [{"name": "image", "shape": list(x.shape), "datatype": "FP32",
                       "data": x.ravel().tolist()}]}
    return json.dumps(doc).encode(), (("content-type", "application/json"),)


class FakeInstances:
    """Triton-like replicas of the linear model by server: ok, refuse, hang, slow."""

    def __init__(self) -> None:
        self.mode: dict[str, str] = {}
        self.calls: list[tuple[str, str]] = []
        self.parity_inputs: list[np.ndarray] = []
        self.release = asyncio.Event()

    async def send(self, route: Location, request: InferRequest) -> UpstreamReply:
        self.calls.append((route.server_id, route.variant))
        mode = self.mode.get(route.server_id, "ok")
        if mode == "refuse" or (self.mode.get("first") == "refuse" and len(self.calls) == 1):
            raise UpstreamError(f"cannot connect to {route.http}")
        if mode == "hang":
            await self.release.wait()
        if mode == "slow":
            await asyncio.sleep(0.05)
        query = read_http_request(request.body, header_length_of(request.headers))
        x = query.inputs["image"]
        if "parity" in route.variant:
            self.parity_inputs.append(x)
        out = {"logits": model(x)}
        if route.variant == "small":
            out = {"logits": np.zeros_like(model(x))}
        data, header = http_answer(query, out, route.model_name, "model")
        headers = {"content-type": "application/json"}
        if header is not None:
            headers["inference-header-content-length"] = str(header)
        return UpstreamReply(200, headers, data)


class Plain:
    """The plain exchange's send: records that it was used."""

    def __init__(self) -> None:
        self.used = 0

    async def __call__(self, request: InferRequest) -> Answer:
        self.used += 1
        return Answer(UpstreamReply(200, {}, b"{}"), Location("h", "g", "m", "s0", "v", 1.0),
                      1, 0, False, False)


class Recorder:
    def __init__(self) -> None:
        self.substitutes: list[tuple[str, str]] = []
        self.groups: list[str] = []
        self.parity: list[str] = []

    def substituted(self, app_id: str, source: str, cause: str) -> None:
        self.substitutes.append((source, cause))

    def group_closed(self, app_id: str, outcome: str) -> None:
        self.groups.append(outcome)

    def parity_sent(self, app_id: str, outcome: str) -> None:
        self.parity.append(outcome)


def setup(*events: dict[str, Any], **protection: Any
          ) -> tuple[RouteBoard, FakeInstances, Recorder, ProtectedPolicy, Plain]:
    board = RouteBoard(RoutingTable())
    for doc in events:
        board.apply(doc)
    fake = FakeInstances()
    recorder = Recorder()
    policy = ProtectedPolicy(APP, board, {"http": fake.send}, Protection(**protection),
                             FifoPolicy(), retry_min_s=0.01, events=recorder)
    return board, fake, recorder, policy, Plain()


def parm(k: int = 2, servers: tuple[str, ...] = ("s1", "s2"), parity: str = "s3"
         ) -> list[dict[str, Any]]:
    docs = [event(1, APP, "serving", servers[0], "v")]
    for seq, server in enumerate(servers[1:], start=2):
        docs.append(event(seq, APP, "instance_ready", server, "v", role="instance"))
    docs.append(event(10, APP, "parity_ready", parity, f"v_parity_k{k}", role="parity"))
    return docs


def request(x: np.ndarray, binary: bool = False, timeout_s: float = 5.0) -> InferRequest:
    data, headers = body(x, binary)
    return InferRequest(APP, asyncio.get_running_loop().time() + timeout_s, data, headers)


def reply_of(outputs: np.ndarray) -> UpstreamReply:
    """An instance's JSON answer with ``logits``."""
    doc = {"outputs": [{"name": "logits", "shape": list(outputs.shape), "datatype": "FP32",
                        "data": outputs.ravel().tolist()}]}
    return UpstreamReply(200, {"content-type": "application/json"}, json.dumps(doc).encode())


def logits(answer: Answer) -> np.ndarray:
    length = answer.reply.headers.get("inference-header-content-length")
    return read_http_reply(answer.reply.body, int(length) if length else None)["logits"]


def queries(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.random((1, 1, 2, 2), dtype=np.float32) for _ in range(n)]


# --- the wire formats -----------------------------------------------------------------------

def test_http_and_grpc_tensors_read_back_what_was_written() -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 1, 2, 2)
    for binary in (False, True):
        data, headers = body(x, binary)
        length = dict(headers).get("inference-header-content-length")
        query = read_http_request(data, int(length) if length else None)
        assert np.array_equal(query.inputs["image"], x) and query.binary_inputs is binary
    answer, header = http_answer(read_http_request(*body(x)[:1], None),
                                 {"logits": model(x)}, "a", "reconstructed", "g1")
    doc = json.loads(answer)
    assert doc["parameters"] == {ANSWER_PARAMETER: "reconstructed",
                                 "understudy_coding_group": "g1"}
    assert header is None and np.allclose(read_http_reply(answer, None)["logits"], model(x))

    from tritonclient.grpc import service_pb2 as pb
    message = pb.ModelInferRequest(model_name="a")
    tensor = message.inputs.add(name="image", datatype="FP32", shape=list(x.shape))
    message.raw_input_contents.append(x.tobytes())
    assert tensor.name == "image"
    query = read_grpc_request(message.SerializeToString())
    assert np.array_equal(query.inputs["image"], x) and query.protocol == "grpc"
    reply = pb.ModelInferResponse.FromString(
        grpc_answer(query, {"logits": model(x)}, "a", "reconstructed", "g1"))
    assert reply.parameters[ANSWER_PARAMETER].string_param == "reconstructed"
    assert np.allclose(read_grpc_reply(reply.SerializeToString())["logits"], model(x))


def test_what_is_not_codable_is_refused_with_a_reason() -> None:
    text = {"inputs": [{"name": "t", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}
    classified = {"inputs": [{"name": "image", "shape": [1], "datatype": "FP32", "data": [1]}],
                  "outputs": [{"name": "logits", "parameters": {"classification": 2}}]}
    for doc in (text, classified, [1, 2]):
        with pytest.raises(NotCodable):
            read_http_request(json.dumps(doc).encode(), None)
    with pytest.raises(NotCodable):
        read_http_request(b"not json", None)


def test_parity_model_names_say_k_and_the_encoder() -> None:
    assert parse_parity_name("digits_cnn_parity_k3") == ("digits_cnn", 3,
                                                         EncoderKind.ADDITION)
    assert parse_parity_name("digits_cnn_parity_k2_concat") == (
        "digits_cnn", 2, EncoderKind.CONCATENATION)
    assert parse_parity_name("digits_cnn") is None
    assert parse_parity_name("x_parity_k1") is None


# --- the routing table ----------------------------------------------------------------------

def test_instances_and_parity_models_come_and_go_with_events_and_failures() -> None:
    table = RoutingTable()
    for doc in parm(3, ("s1", "s2", "s3"), parity="s4"):
        table.apply(doc)
    route = table.apps[APP]
    assert [m.server_id for m in route.members()] == ["s1", "s2", "s3"]
    assert parity_coding(route) == (3, EncoderKind.ADDITION)
    change = table.apply(event(11, APP, "instance_removed", "s2", "v", endpoint=None))
    assert change is not None and list(route.instances) == ["s3"]
    assert route.serving is not None and route.serving.server_id == "s1"  # no move
    table.apply(event(12, APP, "unplaced", None, failed_server="s3"))
    table.apply(event(13, APP, "parity_removed", "s4", "v_parity_k3", endpoint=None))
    assert route.instances == {} and route.parity == {}
    doc = table.to_doc()
    assert RoutingTable.from_doc(doc).apps[APP].instances == route.instances


def test_a_snapshot_reads_instances_and_parity_models_from_the_replicas() -> None:
    table = RoutingTable()
    view = {"app_id": APP, "reason": "", "serving": None, "backups": [], "replicas": [
        {"server_id": "s2", "variant": "v", "role": "instance", "state": "ready",
         "accuracy": 1.0},
        {"server_id": "s3", "variant": "v_parity_k2", "role": "parity", "state": "ready",
         "accuracy": 1.0},
        {"server_id": "s1", "variant": "v_parity_k2", "role": "parity", "state": "loading",
         "accuracy": 1.0}]}
    servers = {s: {"server_id": s, "http": f"h{s}", "grpc": "", "state": "up"}
               for s in ("s1", "s2", "s3")}
    table.apply_snapshot([view], servers)
    route = table.apps[APP]
    assert list(route.instances) == ["s2"] and list(route.parity) == ["s3"]
    assert route.parity["s3"].model_name == f"{APP}__v_parity_k2"


# --- coding groups --------------------------------------------------------------------------

def test_queries_go_at_once_and_a_full_group_sends_its_parity_query() -> None:
    async def scenario() -> None:
        _, fake, recorder, policy, plain = setup(*parm(2))
        xs = queries(2)
        answers = await asyncio.gather(*(policy.dispatch(request(x), plain) for x in xs))
        for _ in range(50):
            if fake.parity_inputs:
                break
            await asyncio.sleep(0.01)
        assert [a.source for a in answers] == ["model", "model"]
        assert {a.route.server_id for a in answers} == {"s1", "s2"}  # balanced
        assert np.allclose(fake.parity_inputs[0], xs[0] + xs[1])
        assert recorder.groups == ["encoded"] and recorder.parity == ["answered"]
        assert plain.used == 0

    run(scenario)


def test_no_query_waits_for_its_group_to_fill_and_a_stale_group_times_out() -> None:
    async def scenario() -> None:
        _, fake, recorder, policy, plain = setup(*parm(3, ("s1", "s2", "s4"), "s3"),
                                                 group_timeout_ms=30)
        answer = await policy.dispatch(request(queries(1)[0]), plain)
        assert answer.source == "model"  # answered with one query of three in its group
        assert recorder.groups == []
        await asyncio.sleep(0.08)
        assert recorder.groups == ["timeout"] and not fake.parity_inputs

    run(scenario)


def test_a_group_takes_its_queries_from_separate_instances() -> None:
    async def scenario() -> None:
        sent: list[list[str]] = []

        async def send_parity(group: Group, inputs: dict[str, np.ndarray],
                              template: Any) -> dict[str, np.ndarray]:
            sent.append([m.query_id for m in group.members])
            return {"logits": model(inputs["image"])}

        coder = Coder(APP, send_parity, 0.05)
        xs = queries(4)
        first = coder.join("q1", request(xs[0]), 2, EncoderKind.ADDITION, "s1")
        second = coder.join("q2", request(xs[1]), 2, EncoderKind.ADDITION, "s1")
        assert second is not first  # both on s1: a group of them could rebuild neither
        third = coder.join("q3", request(xs[2]), 2, EncoderKind.ADDITION, "s2")
        assert third is first and first.full and not second.full  # the oldest open group
        fourth = coder.join("q4", request(xs[3]), 2, EncoderKind.ADDITION, "s2")
        assert fourth is second
        await asyncio.sleep(0.01)
        assert sent == [["q1", "q3"], ["q2", "q4"]]
        assert [m.server_id for m in first.members] == ["s1", "s2"]

    run(scenario)


def test_an_open_group_is_filled_with_answered_queries_and_decodes_with_them() -> None:
    async def scenario() -> None:
        sent: list[list[tuple[str, bool]]] = []

        async def send_parity(group: Group, inputs: dict[str, np.ndarray],
                              template: Any) -> dict[str, np.ndarray]:
            sent.append([(m.query_id, m.stand_in) for m in group.members])
            return {"logits": model(inputs["image"])}

        recorder = Recorder()
        coder = Coder(APP, send_parity, 0.05, recorder)
        xs = queries(4, seed=8)
        odd = np.zeros((1, 1, 3, 3), dtype=np.float32)  # another shape: no stand-in for xs
        first = coder.join("q1", request(xs[0]), 2, EncoderKind.ADDITION, "s1")
        coder.join("q2", request(xs[1]), 2, EncoderKind.ADDITION, "s2")
        alone = coder.join("q3", request(xs[2]), 2, EncoderKind.ADDITION, "s1")
        assert not coder.fill(alone)  # nothing answered yet: nothing to fill with
        for query_id, x in (("q1", xs[0]), ("q2", xs[1])):
            coder.answered(first, query_id, reply_of(model(x)))
        other = coder.join("q9", request(odd), 2, EncoderKind.ADDITION, "s2")
        assert other is alone  # joined on s2 (its shape is only read when it is encoded)
        late = coder.join("q4", request(xs[3]), 2, EncoderKind.ADDITION, "s1")
        assert coder.fill(late) and late.full and not coder.fill(late)  # once only
        await asyncio.sleep(0.01)
        assert sent[-1] == [("q4", False), ("q2", True)]  # the latest answered query
        assert late.decodable("q4")  # the stand-in's own answer is in
        rebuilt = late.reconstruct("q4", APP)
        assert np.allclose(read_http_reply(rebuilt.body, None)["logits"], model(xs[3]),
                           atol=1e-5)
        assert recorder.groups == ["encoded", "unencodable", "filled"]

    run(scenario)


def test_a_late_query_fills_its_group_and_is_rebuilt_without_waiting_for_others() -> None:
    async def scenario() -> None:
        _, fake, recorder, policy, plain = setup(*parm(2), group_fill_ms=5)
        xs = queries(3, seed=9)
        warm = await asyncio.gather(*(policy.dispatch(request(x), plain) for x in xs[:2]))
        assert [a.source for a in warm] == ["model", "model"]
        fake.mode.update(s1="hang", s2="hang")  # whichever instance it takes is stuck
        started = asyncio.get_running_loop().time()
        answer = await policy.dispatch(request(xs[2]), plain)
        assert answer.source == "reconstructed" and answer.route.server_id == "s3"
        assert np.allclose(logits(answer), model(xs[2]), atol=1e-5)
        assert asyncio.get_running_loop().time() - started < 0.045  # before the group timeout
        assert recorder.groups == ["encoded", "filled"]
        assert recorder.substitutes == [("reconstructed", "late")]
        fake.release.set()

    run(scenario)


def test_without_a_fill_time_below_the_group_timeout_a_late_query_waits_for_others() -> None:
    async def scenario() -> None:
        _, fake, recorder, policy, plain = setup(*parm(2), group_fill_ms=50,
                                                 group_timeout_ms=50)
        xs = queries(3, seed=9)
        await asyncio.gather(*(policy.dispatch(request(x), plain) for x in xs[:2]))
        fake.mode.update(s1="hang", s2="hang")
        with pytest.raises(DeadlineError):
            await policy.dispatch(request(xs[2], timeout_s=0.2), plain)
        assert recorder.groups == ["encoded", "timeout"] and len(fake.parity_inputs) == 1
        fake.release.set()

    run(scenario)


def test_the_fill_time_follows_the_apps_answers_and_waits_for_the_straggler_time() -> None:
    async def scenario() -> None:
        _, fake, recorder, policy, plain = setup(*parm(2), straggler_ms=300)
        assert policy.fill_s() == pytest.approx(0.005)  # no answers yet
        for _ in range(16):
            policy.answered_in(0.003)
        assert policy.fill_s() == pytest.approx(0.006)  # twice their median
        xs = queries(3, seed=10)
        await asyncio.gather(*(policy.dispatch(request(x), plain) for x in xs[:2]))
        fake.mode.update(s1="hang", s2="hang")
        with pytest.raises(DeadlineError):  # not yet late: nothing to fill for
            await policy.dispatch(request(xs[2], timeout_s=0.15), plain)
        assert "filled" not in recorder.groups
        fake.release.set()

    run(scenario)


def test_a_failed_instance_is_answered_by_reconstruction_and_marked() -> None:
    async def scenario() -> None:
        _, fake, recorder, policy, plain = setup(*parm(2))
        fake.mode["s2"] = "refuse"
        xs = queries(2, seed=3)
        answers = await asyncio.gather(policy.dispatch(request(xs[0]), plain),
                                       policy.dispatch(request(xs[1], binary=True), plain))
        assert sorted(a.source for a in answers) == ["model", "reconstructed"]
        index = [a.source for a in answers].index("reconstructed")
        rebuilt = answers[index]
        assert answers[1 - index].route.server_id == "s1" and rebuilt.group_id
        assert rebuilt.route.server_id == "s3" and "parity" in rebuilt.route.variant
        assert np.allclose(logits(rebuilt), model(xs[index]), atol=1e-5)  # exact: linear F
        if index == 1:  # binary, as that request asked
            length = int(rebuilt.reply.headers["inference-header-content-length"])
            doc = json.loads(rebuilt.reply.body[:length])
        else:
            doc = json.loads(rebuilt.reply.body)
        assert doc["parameters"][ANSWER_PARAMETER] == "reconstructed"
        assert recorder.substitutes == [("reconstructed", "failed")]
        assert fake.calls.count(("s1", "v")) == 1  # waited for the decode: no resend

    run(scenario)


def test_a_prediction_that_misses_its_deadline_is_decoded_and_the_late_one_dropped() -> None:
    async def scenario() -> None:
        _, fake, recorder, policy, plain = setup(*parm(2), straggler_ms=20)
        fake.mode["s1"] = "hang"
        xs = queries(2, seed=5)
        answers = await asyncio.gather(*(policy.dispatch(request(x), plain) for x in xs))
        assert sorted(a.source for a in answers) == ["model", "reconstructed"]
        index = [a.source for a in answers].index("reconstructed")
        assert np.allclose(logits(answers[index]), model(xs[index]), atol=1e-5)
        assert recorder.substitutes == [("reconstructed", "late")]

    run(scenario)


def test_a_straggler_answered_by_reconstruction_stays_busy_until_it_answers() -> None:
    async def scenario() -> None:
        _, fake, recorder, policy, plain = setup(*parm(2), straggler_ms=20)
        fake.mode["s1"] = "hang"
        xs = queries(3, seed=6)
        answers = await asyncio.gather(*(policy.dispatch(request(x), plain) for x in xs[:2]))
        assert sorted(a.source for a in answers) == ["model", "reconstructed"]
        assert policy.outstanding["s1"] == 1  # still working on it: not idle to the balancer
        third = await policy.dispatch(request(xs[2]), plain)
        assert third.route.server_id == "s2" and fake.calls.count(("s1", "v")) == 1
        fake.release.set()
        for _ in range(50):
            if policy.outstanding["s1"] == 0:
                break
            await asyncio.sleep(0.01)
        assert policy.outstanding["s1"] == 0

    run(scenario)


def test_without_a_decodable_group_a_failed_query_is_sent_to_another_instance() -> None:
    async def scenario() -> None:
        _, fake, recorder, policy, plain = setup(*parm(2), group_timeout_ms=20)
        fake.mode["first"] = "refuse"
        answer = await policy.dispatch(request(queries(1)[0]), plain)  # alone: no parity
        assert answer.source == "model" and answer.attempts == 2
        assert len({server for server, _ in fake.calls[:2]}) == 2  # the other instance
        assert answer.route.server_id == fake.calls[1][0]

    run(scenario)


def test_a_group_that_cannot_be_coded_is_closed_and_its_queries_served_anyway() -> None:
    async def scenario() -> None:
        _, fake, recorder, policy, plain = setup(*parm(2))
        fake.mode["first"] = "refuse"
        text = json.dumps({"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES",
                                       "data": ["x"]}]}).encode()
        loop = asyncio.get_running_loop()
        odd = InferRequest(APP, loop.time() + 5, text, (("content-type", "application/json"),))
        fake_send = fake.send

        async def send(route: Location, request: InferRequest) -> UpstreamReply:
            if request.body is text:  # the model takes it (the gateway cannot read BYTES)
                fake.calls.append((route.server_id, route.variant))
                if len(fake.calls) == 1:
                    raise UpstreamError("refused")
                return UpstreamReply(200, {"content-type": "application/json"}, b"{}")
            return await fake_send(route, request)

        policy.senders["http"] = send
        answers = await asyncio.gather(policy.dispatch(odd, plain),
                                       policy.dispatch(request(queries(1)[0]), plain))
        assert [a.source for a in answers] == ["model", "model"]
        assert answers[0].attempts == 2  # refused, then resent: no reconstruction to wait for
        assert recorder.groups == ["unencodable"] and not fake.parity_inputs

    run(scenario)


def test_an_app_with_one_instance_and_no_substitute_takes_the_plain_exchange() -> None:
    async def scenario() -> None:
        _, _, _, policy, plain = setup(event(1, APP, "serving", "s1", "v"))
        answer = await policy.dispatch(request(queries(1)[0]), plain)
        assert plain.used == 1 and answer.route.server_id == "s0"

    run(scenario)


# --- the baselines --------------------------------------------------------------------------

def test_equal_resources_balances_over_every_instance_without_coding() -> None:
    async def scenario() -> None:
        board, fake, recorder, policy, plain = setup(*parm(2), mode="equal-resources")
        board.apply(event(20, APP, "instance_ready", "s4", "v", role="instance"))
        route = board.route(APP)
        assert route is not None and effective_mode(policy.protection, route) == \
            "equal-resources"
        answers = await asyncio.gather(*(policy.dispatch(request(x), plain)
                                         for x in queries(3)))
        assert {a.route.server_id for a in answers} == {"s1", "s2", "s4"}
        assert not fake.parity_inputs and recorder.groups == []

    run(scenario)


def test_the_default_response_answers_a_late_prediction_with_the_default_class() -> None:
    async def scenario() -> None:
        _, fake, recorder, policy, plain = setup(*parm(2), mode="default-response",
                                                 straggler_ms=20, default_class=2)
        first = await policy.dispatch(request(queries(1)[0]), plain)  # learns the shapes
        assert first.source == "model"
        fake.mode.update(s1="hang", s2="hang")
        late = await policy.dispatch(request(queries(1)[0]), plain)
        assert late.source == "default" and late.route.variant == "default"
        assert logits(late).tolist() == [[0.0, 0.0, 1.0]]
        assert recorder.substitutes == [("default", "late")]

    run(scenario)


def test_the_approximate_backup_answers_for_a_failed_instance() -> None:
    async def scenario() -> None:
        board, fake, recorder, policy, plain = setup(*parm(2), mode="approximate-backup")
        board.apply(event(30, APP, "backup_ready", "s5", "small", role="warm"))
        fake.mode.update(s1="refuse", s2="refuse")
        answer = await policy.dispatch(request(queries(1)[0]), plain)
        assert answer.source == "approximate" and answer.route.server_id == "s5"
        assert ("s5", "small") in fake.calls
        assert recorder.substitutes == [("approximate", "failed")]

    run(scenario)
