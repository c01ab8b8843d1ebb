"""The agent hub binds a connection to its credential's server (``controller.agents``)."""

from __future__ import annotations

import asyncio
import json

from controller.agents import POLICY_VIOLATION
from tests.unit.test_hostile_frames import ScriptedSocket, _hello, _hub, _until
from understudy.wire.protocol import TritonDown


def test_a_hello_for_another_server_than_the_credentials_is_refused() -> None:
    async def scenario() -> None:
        hub, hellos = _hub()
        socket = ScriptedSocket(json.dumps(_hello(server_id="s1")))
        await asyncio.wait_for(hub.serve(socket, credential_server="s2"), 5)
        assert hellos == [] and socket.sent == [] and not hub.connected("s1")
        assert socket.closed == [(POLICY_VIOLATION,
                                  "this credential speaks for server s2, not s1")]

    asyncio.run(scenario())


def test_only_the_current_connection_of_a_server_is_believed() -> None:
    async def scenario() -> None:
        hub, hellos = _hub()
        first = ScriptedSocket(json.dumps(_hello(server_id="s1")))
        second = ScriptedSocket(json.dumps(_hello(server_id="s1", boot_id="b2")))
        tasks = [asyncio.ensure_future(hub.serve(first, credential_server="s1"))]
        await _until(lambda: len(hellos) == 1)
        tasks.append(asyncio.ensure_future(hub.serve(second, credential_server="s1")))
        await _until(lambda: len(hellos) == 2 and first.closed)
        assert first.closed[0][0] == 1001 and hub.connected("s1")
        down = TritonDown(at=1.0)
        hub._route("s1", down, first)  # the replaced connection: stale, ignored
        assert hub.detector.declared == []  # type: ignore[attr-defined]
        hub._route("s1", down, second)
        assert hub.detector.declared == ["s1"]  # type: ignore[attr-defined]
        await hub.close_all()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)

    asyncio.run(scenario())
