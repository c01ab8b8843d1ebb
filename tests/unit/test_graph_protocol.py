"""Wire messages for service-graph replicas on agents: round trips, defaults, bad frames."""

from __future__ import annotations

import json

import pytest

from understudy.wire.protocol import (
    CommandResult,
    Hello,
    ProtocolError,
    ReplicaExited,
    ReplicaInfo,
    StartReplicaCommand,
    StopReplicaCommand,
    encode,
    parse_agent_message,
    parse_controller_message,
)


def test_replica_commands_round_trip_with_defaults() -> None:
    start = StartReplicaCommand(command_id="c1", graph="sp", node="sentiment.p0")
    assert parse_controller_message(encode(start)) == start
    assert start.log_level == "WARNING" and start.observe_dir is None
    stop = StopReplicaCommand(command_id="c2", graph="sp", node="spare.3", kill=True)
    assert parse_controller_message(encode(stop)) == stop
    assert StopReplicaCommand(command_id="c3", graph="sp", node="a.b0").timeout_s == 5.0


def test_agent_replica_messages_round_trip() -> None:
    info = ReplicaInfo(graph="sp", node="stock.b0", address="10.0.0.2:4100", pid=77,
                       started_at=1.0)
    hello = Hello(server_id="s1", site_id="a", capacity={"memory_mb": 1.0}, replicas=[info])
    result = CommandResult(command_id="c1", ok=True, command="start_replica", replica=info)
    exited = ReplicaExited(graph="sp", node="stock.b0", at=2.0, exit_code=-9)
    for message in (hello, result, exited):
        assert parse_agent_message(encode(message)) == message
    assert not exited.requested


def test_older_frames_still_parse() -> None:
    # A hello and a result from an agent that predates replicas: the new fields default.
    hello = parse_agent_message(json.dumps({"v": 1, "type": "hello", "server_id": "s1",
                                            "site_id": "a", "capacity": {}}))
    assert isinstance(hello, Hello) and hello.replicas == []
    result = parse_agent_message('{"v": 1, "type": "result", "command_id": "c", "ok": true}')
    assert isinstance(result, CommandResult) and result.replica is None


@pytest.mark.parametrize("frame, match", [
    ({"type": "start_replica", "command_id": "c", "graph": "sp"}, "node"),
    ({"type": "start_replica", "command_id": "c", "graph": "sp", "node": "../x"}, "node"),
    ({"type": "start_replica", "command_id": "c", "graph": "s p", "node": "a"}, "graph"),
    ({"type": "start_replica", "command_id": "c", "graph": "sp", "node": "a",
      "log_level": "LOUD"}, "log_level"),
    ({"type": "stop_replica", "command_id": "c", "graph": "sp", "node": "a",
      "timeout_s": -1}, "timeout_s"),
])
def test_bad_replica_commands_are_rejected_with_their_id(frame: dict[str, object],
                                                         match: str) -> None:
    with pytest.raises(ProtocolError, match=match) as err:
        parse_controller_message(json.dumps({"v": 1, **frame}))
    assert err.value.command_id == "c"
