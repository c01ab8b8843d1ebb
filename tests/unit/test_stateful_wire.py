"""Wire format: versioned pydantic envelopes, tensors as raw bytes (base64 in JSON), no pickle."""

from __future__ import annotations

import json

import pytest
import torch

from stateful.errors import WireFormatError
from stateful.messages import (
    Data,
    Envelope,
    LineageEntry,
    OutputRecord,
    Payload,
    RequestMeta,
    StateUpdate,
    decode,
    decode_frame,
    encode,
    encode_frame,
)
from stateful.tensors import from_payload, to_payload


def record(rid: int = 1) -> OutputRecord:
    payload = to_payload(torch.arange(6, dtype=torch.float32).reshape(2, 3))
    return OutputRecord(request_id=rid, seq=rid, meta=RequestMeta(stream="s", entries=("a",)),
                        lineage={"a": LineageEntry(0, rid, payload.digest)}, payload=payload)


def test_data_round_trips_with_lineage_and_tensor() -> None:
    frame = encode("a.p0", "b.p0", Data(src_op="a", records=(record(), record(2)), cv=3))
    env = decode(frame)
    assert (env.v, env.src, env.dst) == (1, "a.p0", "b.p0")
    assert isinstance(env.msg, Data) and env.msg.cv == 3
    assert [r.request_id for r in env.msg.records] == [1, 2]
    got = env.msg.records[0]
    assert got.lineage["a"] == LineageEntry(0, 1, got.payload.digest)
    assert torch.equal(from_payload(got.payload), torch.arange(6.0).reshape(2, 3))
    body = json.loads(frame)
    assert isinstance(body["msg"]["records"][0]["payload"]["data"], str)  # base64, not a list


def test_state_update_round_trips() -> None:
    msg = StateUpdate(op="a", epoch=2, batch_no=7, last_seq=40, overwrite=True,
                      tensors={"h:s": to_payload(torch.ones(4))}, records=(record(40),),
                      gc_upto=3)
    assert decode(encode("x", "y", msg)).msg == msg


def test_binary_frames_carry_tensors_as_attachments() -> None:
    big = to_payload(torch.arange(1000, dtype=torch.float32))
    msg = StateUpdate(op="a", epoch=0, batch_no=1, last_seq=2, tensors={"w": big},
                      records=(record(1), record(2)))
    frame = encode_frame("x", "y", msg, link=9)
    env = decode_frame(frame)
    assert env.msg == msg and env.link == 9
    assert b"#0" in frame and len(frame) < len(encode("x", "y", msg))
    with pytest.raises(WireFormatError):
        decode_frame(frame[:-3])
    with pytest.raises(WireFormatError):
        decode(b'{"v":1,"src":"a","dst":"b","msg":{"type":"state","op":"a","epoch":0,'
               b'"batch_no":1,"last_seq":1,"tensors":{"w":{"shape":[1],"data":"#0"}},'
               b'"records":[]}}')


@pytest.mark.parametrize("frame", [
    b"not json",
    b'{"v": 2, "src": "a", "dst": "b", "msg": {"type": "collect", "upto": 1}}',
    b'{"v": 1, "src": "a", "dst": "b", "msg": {"type": "nope"}}',
    b'{"v": 1, "src": "a", "dst": "b", "msg": {"type": "collect", "upto": "x"}}',
])
def test_malformed_frames_raise_wire_format_error(frame: bytes) -> None:
    with pytest.raises(WireFormatError):
        decode(frame)


def test_payload_size_must_match_shape() -> None:
    with pytest.raises(WireFormatError):
        from_payload(Payload(shape=(3,), data=b"\0" * 8))


def test_digest_depends_on_values_shape_and_dtype() -> None:
    a = to_payload(torch.zeros(4))
    assert a.digest == to_payload(torch.zeros(4)).digest
    assert a.digest != to_payload(torch.zeros(2, 2)).digest
    assert a.digest != to_payload(torch.tensor([0.0, 0.0, 0.0, 1e-7])).digest
    assert to_payload(torch.arange(3)).dtype == "int64"


def test_envelope_forbids_unknown_fields() -> None:
    with pytest.raises(ValueError):
        Envelope.model_validate({"v": 1, "src": "a", "dst": "b", "extra": 1,
                                 "msg": {"type": "collect", "upto": 1}})
