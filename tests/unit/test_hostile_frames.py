"""Hostile agent frames: refused whole by the protocol, and the connection closed with a reason.

The protocol half checks ``understudy.wire.protocol`` alone; the hub half drives
``controller.agents.AgentHub.serve`` over a scripted websocket, so it shows what the controller
does with each refusal (close code and reason, nothing handed on, the waiting command failed).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from controller.agents import MESSAGE_TOO_BIG, POLICY_VIOLATION, AgentHub, close_reason
from controller.errors import AgentCommandError, AgentUnavailableError
from understudy.wire.protocol import (
    MAX_FRAME_BYTES,
    MAX_MODELS,
    CommandResult,
    ErrorInfo,
    FrameTooLargeError,
    HeartbeatChannel,
    Hello,
    InventoryCommand,
    ProtocolError,
    UnknownMessageError,
    encode,
    parse_agent_message,
)


def _hello(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "v": 1, "type": "hello", "server_id": "s1", "site_id": "site-a",
        "capacity": {"memory_mb": 16000.0, "compute": 100.0}, "boot_id": "0f3a",
        "endpoints": {"http": "http://10.0.0.1:8000", "grpc": "10.0.0.1:8001"},
        "inventory": [{"model_name": "cam-1__resnet18", "app_id": "cam-1",
                       "variant": "resnet18", "state": "ready", "memory_mb": 90.5}]}
    return {**base, **changes}


def _item(name: str, app_id: str, variant: str) -> dict[str, Any]:
    return {"model_name": name, "app_id": app_id, "variant": variant, "state": "ready"}


HOSTILE_HELLOS = {
    "NaN capacity": '{"v":1,"type":"hello","server_id":"s1","site_id":"a",'
                    '"capacity":{"memory_mb":NaN}}',
    "infinite capacity": '{"v":1,"type":"hello","server_id":"s1","site_id":"a",'
                         '"capacity":{"memory_mb":Infinity}}',
    "negative capacity": _hello(capacity={"memory_mb": -1.0}),
    "huge capacity": _hello(capacity={"memory_mb": 1e300}),
    "too many resources": _hello(capacity={f"r{i}": 1.0 for i in range(100)}),
    "resource name with a space": _hello(capacity={"memory mb": 1.0}),
    "empty server id": _hello(server_id=""),
    "huge server id": _hello(server_id="s" * 10_000),
    "server id with a slash": _hello(server_id="a/b"),
    "server id glob": _hello(server_id="*"),
    "unicode server id": _hello(server_id="s\u00e9rveur"),
    "empty site id": _hello(site_id=""),
    "tiny heartbeat interval": _hello(heartbeat_interval_ms=5e-324),
    "huge heartbeat interval": _hello(heartbeat_interval_ms=1e9),
    "boot id with spaces": _hello(boot_id="a b"),
    "endpoint with whitespace": _hello(endpoints={"http": "http://x y", "grpc": "x:1"}),
    "inventory name that is not app__variant": _hello(
        inventory=[_item("other__v", "cam-1", "v")]),
    "inventory app id with the separator": _hello(inventory=[_item("a__b__c", "a__b", "c")]),
    "inventory too long": _hello(inventory=[_item(f"a{i}__v", f"a{i}", "v")
                                            for i in range(MAX_MODELS + 1)]),
    "NaN memory in the inventory": _hello(inventory=[{**_item("a__v", "a", "v"),
                                                      "memory_mb": float("nan")}]),
    "negative pid": _hello(agent_pid=-5),
    "no type": {k: v for k, v in _hello().items() if k != "type"},
}


def _raw(frame: str | dict[str, Any]) -> str:
    return frame if isinstance(frame, str) else json.dumps(frame)


@pytest.mark.parametrize("frame", HOSTILE_HELLOS.values(), ids=HOSTILE_HELLOS.keys())
def test_hostile_hellos_are_refused_whole(frame: str | dict[str, Any]) -> None:
    with pytest.raises(ProtocolError, match="invalid") as refused:
        parse_agent_message(_raw(frame))
    assert not isinstance(refused.value, UnknownMessageError)
    assert len(str(refused.value)) < 1000  # a refusal never quotes a hostile frame whole


def test_the_hellos_real_agents_send_are_accepted() -> None:
    hello = parse_agent_message(json.dumps(_hello(heartbeat_interval_ms=1.0, agent_pid=4242)))
    assert isinstance(hello, Hello) and hello.capacity["memory_mb"] == 16000.0
    assert hello.inventory[0].app_id == "cam-1"
    # Every field at its default (what a minimal agent sends).
    minimal = Hello(server_id="edge-07.site_b", site_id="b", capacity={})
    assert parse_agent_message(encode(minimal)) == minimal


def test_frames_over_the_size_limit_are_refused_before_parsing() -> None:
    padding = "x" * (MAX_FRAME_BYTES + 1)
    with pytest.raises(FrameTooLargeError):
        parse_agent_message(json.dumps(_hello(boot_id=padding)))
    # Counted in bytes: a frame of multi-byte characters is measured as it travels.
    with pytest.raises(FrameTooLargeError):
        parse_agent_message('"' + "\u00e9" * (MAX_FRAME_BYTES // 2 + 1) + '"')


def test_deeply_nested_and_malformed_frames_are_protocol_errors() -> None:
    for raw in ("[" * 100_000 + "]" * 100_000, '{"v": 1, "type": "hello"', "\x00"):
        with pytest.raises(ProtocolError):
            parse_agent_message(raw)


def test_results_and_reports_are_bounded_too() -> None:
    bad = [
        {"type": "result", "command_id": "c" * 1000, "ok": True},
        {"type": "result", "command_id": "c1", "ok": True, "timings": {"load_s": -1.0}},
        {"type": "result", "command_id": "c1", "ok": True, "timings": {"load_s": 1e300}},
        {"type": "triton_down", "at": -1.0},
        {"type": "triton_down", "at": 1.0, "lost_models": ["x"] * (MAX_MODELS + 1)},
        {"type": "triton_up", "at": 1.0, "endpoints": {"http": "", "grpc": "g:1"}},
        {"type": "replica_exited", "graph": "", "node": "n", "at": 1.0},
    ]
    for frame in bad:
        with pytest.raises(ProtocolError, match="invalid"):
            parse_agent_message(json.dumps({"v": 1, **frame}))
    with pytest.raises(ProtocolError, match="invalid result"):
        parse_agent_message('{"v":1,"type":"result","command_id":"c1","ok":true,'
                            '"timings":{"load_s":NaN}}')


def test_a_long_error_message_is_cut_not_refused() -> None:
    """An agent's long exception text must not cost it its connection."""
    result = parse_agent_message(json.dumps({
        "v": 1, "type": "result", "command_id": "c1", "ok": False,
        "error": {"code": "load_failed", "message": "x" * 100_000}}))
    assert isinstance(result, CommandResult) and result.error is not None
    assert 0 < len(result.error.message) <= 8192
    assert len(ErrorInfo(code="c", message="y" * 100_000).message) <= 8192


def test_a_frame_of_an_unknown_type_is_told_apart() -> None:
    with pytest.raises(UnknownMessageError):
        parse_agent_message('{"v": 1, "type": "from_the_future", "x": 1}')


def test_close_reasons_fit_a_close_frame() -> None:
    reason = close_reason("bad hello: " + "\u00e9" * 200)
    assert len(reason.encode()) <= 123 and reason.startswith("bad hello")


# --- the hub ------------------------------------------------------------------------------------


class ScriptedSocket:
    """A FastAPI websocket stand-in: hands out the scripted frames, records sends and closes."""

    def __init__(self, *frames: str) -> None:
        self.incoming: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        for frame in frames:
            self.push(frame)
        self.sent: list[str] = []
        self.closed: list[tuple[int, str]] = []

    def push(self, frame: str) -> None:
        self.incoming.put_nowait({"type": "websocket.receive", "text": frame})

    async def receive(self) -> dict[str, Any]:
        if self.closed:
            return {"type": "websocket.disconnect", "code": self.closed[0][0]}
        return await self.incoming.get()

    async def send_text(self, text: str) -> None:
        self.sent.append(text)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed.append((code, reason))
        self.incoming.put_nowait({"type": "websocket.disconnect", "code": code})


class QuietDetector:
    """The failure detector's surface the hub uses, without a monitor process."""

    def __init__(self) -> None:
        self.alive_listeners: list[Callable[[str], None]] = []
        self.closed: list[str] = []
        self.declared: list[str] = []

    def admit(self, server_id: str, triton_http: str | None) -> HeartbeatChannel:
        return HeartbeatChannel(port=9999, slot=1, nonce=7)

    def connection_closed(self, server_id: str) -> None:
        self.closed.append(server_id)

    def declare(self, server_id: str, reason: str) -> None:
        self.declared.append(server_id)


async def _until(predicate: Callable[[], object], timeout_s: float = 5.0) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.001)

    await asyncio.wait_for(poll(), timeout_s)


def _hub() -> tuple[AgentHub, list[Hello]]:
    hellos: list[Hello] = []

    async def on_hello(hello: Hello) -> None:
        hellos.append(hello)

    async def ignore(*_: Any) -> None:
        return None

    return AgentHub(QuietDetector(), on_hello, ignore, ignore), hellos  # type: ignore[arg-type]


@pytest.mark.parametrize("frame", [HOSTILE_HELLOS["NaN capacity"],
                                   HOSTILE_HELLOS["empty server id"]],
                         ids=["NaN capacity", "empty server id"])
def test_a_bad_hello_closes_the_connection_with_a_reason(frame: str | dict[str, Any]) -> None:
    async def scenario() -> None:
        hub, hellos = _hub()
        socket = ScriptedSocket(_raw(frame))
        await asyncio.wait_for(hub.serve(socket), 5)
        assert hellos == [] and socket.sent == []  # no channel, nothing handed on
        (code, reason), = socket.closed
        assert code == POLICY_VIOLATION and reason.startswith("bad hello: invalid hello")

    asyncio.run(scenario())


def test_a_hello_too_large_closes_with_1009() -> None:
    async def scenario() -> None:
        hub, hellos = _hub()
        socket = ScriptedSocket(json.dumps(_hello(boot_id="x" * (MAX_FRAME_BYTES + 1))))
        await asyncio.wait_for(hub.serve(socket), 5)
        assert hellos == [] and socket.closed[0][0] == MESSAGE_TOO_BIG

    asyncio.run(scenario())


def test_a_first_frame_that_is_no_hello_is_refused() -> None:
    async def scenario() -> None:
        hub, hellos = _hub()
        socket = ScriptedSocket(encode(CommandResult(command_id="c1", ok=True)))
        await asyncio.wait_for(hub.serve(socket), 5)
        assert hellos == [] and socket.closed == [(POLICY_VIOLATION,
                                                   "expected a hello frame, got 'result'")]

    asyncio.run(scenario())


def test_a_bad_frame_after_the_hello_closes_and_fails_the_command_it_answers() -> None:
    async def scenario() -> None:
        hub, hellos = _hub()
        socket = ScriptedSocket(json.dumps(_hello()))
        serving = asyncio.ensure_future(hub.serve(socket))
        await _until(lambda: hellos)
        assert [h.server_id for h in hellos] == ["s1"] and hub.connected("s1")
        command = InventoryCommand(command_id=hub.next_id())
        answer = asyncio.ensure_future(hub.command("s1", command, timeout_s=30))
        await _until(lambda: len(socket.sent) == 2)  # the channel, then the command
        # A frame of a type it does not know is skipped; the connection stays.
        socket.push('{"v": 1, "type": "from_the_future"}')
        await _until(socket.incoming.empty)  # taken, and handled in the same step
        assert socket.closed == [] and hub.connected("s1")
        socket.push(json.dumps({"v": 1, "type": "result", "command_id": command.command_id,
                                "ok": True, "timings": {"load_s": float("nan")}}))
        with pytest.raises(AgentCommandError, match="invalid result frame"):
            await asyncio.wait_for(answer, 5)  # at once, not after its 30 s
        await asyncio.wait_for(serving, 5)
        assert socket.closed[0][0] == POLICY_VIOLATION
        assert "finite" in socket.closed[0][1] and not hub.connected("s1")
        assert hub.detector.closed == ["s1"]  # type: ignore[attr-defined]

    asyncio.run(scenario())


def test_a_result_for_another_servers_command_is_ignored() -> None:
    async def scenario() -> None:
        hub, _ = _hub()
        first, second = ScriptedSocket(json.dumps(_hello())), \
            ScriptedSocket(json.dumps(_hello(server_id="s2")))
        tasks = [asyncio.ensure_future(hub.serve(s)) for s in (first, second)]
        await _until(lambda: hub.connected("s1") and hub.connected("s2"))
        command = InventoryCommand(command_id=hub.next_id())
        answer = asyncio.ensure_future(hub.command("s1", command, timeout_s=30))
        await _until(lambda: len(first.sent) == 2)
        second.push(encode(CommandResult(command_id=command.command_id, ok=True)))
        await _until(second.incoming.empty)
        assert not answer.done()  # s2 cannot answer for s1
        first.push(encode(CommandResult(command_id=command.command_id, ok=True,
                                        command="inventory")))
        assert (await asyncio.wait_for(answer, 5)).command == "inventory"
        await hub.close_all()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)

    asyncio.run(scenario())


def test_commands_to_a_server_whose_connection_closes_fail_at_once() -> None:
    async def scenario() -> None:
        hub, hellos = _hub()
        socket = ScriptedSocket(json.dumps(_hello()))
        serving = asyncio.ensure_future(hub.serve(socket))
        await _until(lambda: hellos)
        command = InventoryCommand(command_id=hub.next_id())
        answer = asyncio.ensure_future(hub.command("s1", command, timeout_s=300))
        await _until(lambda: len(socket.sent) == 2)
        await socket.close(1006, "gone")  # the agent died: no answer is coming
        with pytest.raises(AgentUnavailableError, match="connection closed"):
            await asyncio.wait_for(answer, 5)  # at once, not after its 300 s
        await asyncio.wait_for(serving, 5)

    asyncio.run(scenario())


def test_commands_to_a_server_declared_failed_fail_at_once_and_no_others() -> None:
    async def scenario() -> None:
        hub, _ = _hub()
        first, second = ScriptedSocket(json.dumps(_hello())), \
            ScriptedSocket(json.dumps(_hello(server_id="s2")))
        tasks = [asyncio.ensure_future(hub.serve(s)) for s in (first, second)]
        await _until(lambda: hub.connected("s1") and hub.connected("s2"))
        to_s1 = InventoryCommand(command_id=hub.next_id())
        to_s2 = InventoryCommand(command_id=hub.next_id())
        answers = [asyncio.ensure_future(hub.command(s, c, timeout_s=300))
                   for s, c in (("s1", to_s1), ("s2", to_s2))]
        await _until(lambda: len(first.sent) == 2 and len(second.sent) == 2)
        assert hub.fail_pending("s1", "declared failed") == 1
        with pytest.raises(AgentUnavailableError, match="declared failed"):
            await asyncio.wait_for(answers[0], 5)
        assert not answers[1].done()
        second.push(encode(CommandResult(command_id=to_s2.command_id, ok=True,
                                         command="inventory")))
        assert (await asyncio.wait_for(answers[1], 5)).ok
        await hub.close_all()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)

    asyncio.run(scenario())
