"""Just enough of the protobuf wire format to route KServe v2 gRPC requests without decoding them.

Every model-scoped request of ``inference.GRPCInferenceService`` names its model in field 1 and
its version in field 2, and every infer or metadata response names the model in field 1. The
gateway reads those two fields by walking the message's top-level fields (a tensor's bytes are
skipped by their length, not read), and renames a model by appending field 1 again: for a
singular field the parser keeps the last value, so the rest of the message is passed on as it
came.
"""

from __future__ import annotations

NAME_FIELD = 1
VERSION_FIELD = 2
_LENGTH_DELIMITED = 2


class WireError(ValueError):
    """Bytes that are not a protobuf message."""


def _varint(data: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise WireError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise WireError("varint too long")


def name_and_version(message: bytes | bytearray) -> tuple[str, str]:
    """Fields 1 and 2 (strings) of a message: the model's name and version (last ones win)."""
    view = memoryview(message)
    name = version = b""
    pos, end = 0, len(view)
    while pos < end:
        key, pos = _varint(view, pos)
        field, kind = key >> 3, key & 7
        if kind == 0:
            _, pos = _varint(view, pos)
        elif kind == 1:
            pos += 8
        elif kind == _LENGTH_DELIMITED:
            size, pos = _varint(view, pos)
            if pos + size > end:
                raise WireError("truncated field")
            if field == NAME_FIELD:
                name = bytes(view[pos:pos + size])
            elif field == VERSION_FIELD:
                version = bytes(view[pos:pos + size])
            pos += size
        elif kind == 5:
            pos += 4
        else:
            raise WireError(f"unsupported wire type {kind}")
    if pos != end:
        raise WireError("truncated message")
    try:
        return name.decode(), version.decode()
    except UnicodeDecodeError as exc:
        raise WireError("model name is not UTF-8") from exc


def string_field(field: int, value: str) -> bytes:
    """One length-delimited field holding ``value``."""
    data = value.encode()
    key = bytes([field << 3 | _LENGTH_DELIMITED])
    size = bytearray()
    length = len(data)
    while True:
        byte = length & 0x7F
        length >>= 7
        if length:
            size.append(byte | 0x80)
        else:
            size.append(byte)
            return key + bytes(size) + data


def renamed(message: bytes | bytearray, name: str) -> bytes:
    """The message with field 1 (the model's name) set to ``name``."""
    return b"".join((message, string_field(NAME_FIELD, name)))
