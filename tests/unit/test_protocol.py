"""Controller-agent wire messages: round trips, versioning, and clear rejection of bad frames."""

from __future__ import annotations

import json

import pytest

from understudy.wire.protocol import (
    CommandResult,
    HeartbeatChannel,
    Hello,
    InventoryItem,
    LoadCommand,
    ModelState,
    ProtocolError,
    TritonDown,
    encode,
    model_name,
    parse_agent_message,
    parse_controller_message,
    split_model_name,
)


def test_model_names_round_trip() -> None:
    assert model_name("cam-1", "resnet18") == "cam-1__resnet18"
    assert split_model_name("cam-1__resnet18") == ("cam-1", "resnet18")
    with pytest.raises(ValueError):
        split_model_name("plain")


def test_agent_messages_round_trip() -> None:
    hello = Hello(server_id="s1", site_id="a", capacity={"memory_mb": 10.0},
                  inventory=[InventoryItem(model_name="x__v", app_id="x", variant="v",
                                           state=ModelState.READY, memory_mb=3.0)])
    for message in (hello, TritonDown(at=1.5, exit_code=9),
                    CommandResult(command_id="c1", ok=True, timings={"load_s": 0.1})):
        assert parse_agent_message(encode(message)) == message


def test_commands_round_trip_and_validate_names() -> None:
    load = LoadCommand(command_id="c1", app_id="cam-1", variant="resnet18")
    assert parse_controller_message(encode(load)) == load
    assert load.model_name == "cam-1__resnet18"
    with pytest.raises(ProtocolError, match="app_id") as err:
        parse_controller_message(json.dumps(
            {"v": 1, "type": "load", "command_id": "c2", "app_id": "a__b", "variant": "v"}))
    assert err.value.command_id == "c2"


@pytest.mark.parametrize("raw, match", [
    ("nope", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"v": 1, "type": "fly", "command_id": "c"}', "invalid fly frame"),
    ('{"v": 2, "type": "inventory", "command_id": "c"}', "version 2"),
    ('{"v": 1, "type": "load", "command_id": ""}', "invalid load frame"),
])
def test_bad_frames_are_rejected_with_a_message(raw: str, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        parse_controller_message(raw)


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    raw = json.dumps({"v": 1, "type": "triton_down", "at": 2.0, "new": "x"})
    assert parse_agent_message(raw) == TritonDown(at=2.0)


def test_heartbeat_channel_is_validated() -> None:
    channel = HeartbeatChannel(port=9000, slot=3, nonce=2**63 + 5)
    assert parse_controller_message(encode(channel)) == channel
    for bad in ({"port": 0}, {"nonce": 0}, {"nonce": 2**64}, {"heartbeat_interval_ms": 0}):
        fields = {"v": 1, "type": "heartbeat_channel", "port": 9000, "slot": 1, "nonce": 7}
        with pytest.raises(ProtocolError):
            parse_controller_message(json.dumps({**fields, **bad}))
