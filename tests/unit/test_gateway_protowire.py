"""Reading and renaming the model in KServe v2 gRPC messages without decoding them."""

from __future__ import annotations

import pytest
from tritonclient.grpc import service_pb2 as pb

from gateway.protowire import WireError, name_and_version, renamed, string_field


def test_the_model_and_version_are_read_past_the_tensors() -> None:
    request = pb.ModelInferRequest(id="7", model_version="2")
    request.raw_input_contents.append(bytes(range(256)) * 300)
    request.parameters["sequence_id"].int64_param = 12
    request.model_name = "app-1"  # serialized first, whatever the order it is set in
    assert name_and_version(request.SerializeToString()) == ("app-1", "2")
    assert name_and_version(pb.ServerLiveRequest().SerializeToString()) == ("", "")


def test_renaming_keeps_everything_else() -> None:
    request = pb.ModelInferRequest(model_name="app-1", model_version="1", id="x")
    request.raw_input_contents.append(b"\x00\x01" * 5000)
    copy = pb.ModelInferRequest.FromString(renamed(request.SerializeToString(),
                                                   "app-1__resnet" + "x" * 200))
    assert copy.model_name == "app-1__resnet" + "x" * 200  # a name longer than 127 bytes
    copy.model_name = "app-1"
    assert copy == request
    reply = pb.ModelMetadataResponse(name="app-1__resnet", versions=["1"])
    assert pb.ModelMetadataResponse.FromString(renamed(reply.SerializeToString(),
                                                       "app-1")).name == "app-1"


@pytest.mark.parametrize("data", [b"\x0a\x05ab", b"\x0a", b"\xff" * 11, b"\x0b\x00",
                                  string_field(1, "ok") + b"\x12"])
def test_malformed_messages_are_refused(data: bytes) -> None:
    with pytest.raises(WireError):
        name_and_version(data)
