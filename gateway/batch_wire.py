"""Requests batched by a scheduler, on the wire: many queries in, one Triton request, split back.

A scheduler (``gateway.batching``) sends the requests of a batch as **one** Triton request with
the batch dimension: their inputs are read (``gateway.tensors``), stacked along the first axis
and sent in the binary tensor extension; the reply's outputs are cut back into each request's
rows and written as that request's answer, in its own protocol (HTTP JSON or binary, gRPC).
Requests that cannot be stacked together (different shapes or types) go in separate Triton
requests of the same batch; a request whose tensors the gateway does not read goes alone, as it
came.

A dynamic model may report each row's execution time in an output (``exec_output``, in
microseconds, one value per row): :func:`exec_times` reads it for the scheduler's profile.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from gateway.exchange import InferRequest
from gateway.tensors import (
    NotCodable,
    Query,
    grpc_answer,
    http_answer,
    http_request,
    read_http_reply,
    read_request,
)
from gateway.upstream import UpstreamReply

MODEL_SOURCE = "model"


@dataclass(eq=False)
class Member:
    """One request of a batch, its tensors read (``query`` None: not stackable)."""

    key: Hashable
    request: InferRequest
    query: Query | None

    @property
    def rows(self) -> int:
        """Rows it adds to the batch (its inputs' first dimension)."""
        if self.query is None:
            return 1
        first = next(iter(self.query.inputs.values()))
        return int(first.shape[0]) if first.ndim else 1


def read_member(key: Hashable, request: InferRequest) -> Member:
    """The request as a batch member (its tensors read when the gateway can read them)."""
    try:
        query = read_request(request.protocol, request.body, request.headers)
    except NotCodable:
        query = None
    if query is not None and any(a.ndim == 0 for a in query.inputs.values()):
        query = None
    return Member(key, request, query)


def _signature(query: Query) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    return tuple(sorted((n, a.dtype.str, a.shape[1:]) for n, a in query.inputs.items()))


def groups(members: Sequence[Member], max_rows: int,
           place: Callable[[Member], Hashable] = lambda member: None) -> list[list[Member]]:
    """The Triton requests a batch goes in, at most ``max_rows`` each.

    Stackable members served at the same ``place`` go together.
    """
    out: list[list[Member]] = []
    open_groups: dict[tuple[object, ...], tuple[list[Member], int]] = {}
    for member in members:
        if member.query is None:
            out.append([member])
            continue
        signature = (place(member), *_signature(member.query))
        current = open_groups.get(signature)
        if current is None or current[1] + member.rows > max_rows:
            group: list[Member] = []
            out.append(group)
            current = (group, 0)
        current[0].append(member)
        open_groups[signature] = (current[0], current[1] + member.rows)
    return out


def pack(members: Sequence[Member]) -> tuple[bytes, tuple[tuple[str, str], ...]]:
    """One Triton infer body carrying every member's rows (binary extension), and its headers."""
    first = members[0].query
    assert first is not None  # noqa: S101 - groups() puts unreadable members alone
    inputs = {name: np.concatenate([m.query.inputs[name] for m in members  # type: ignore[union-attr]
                                    ], axis=0)
              for name in first.inputs}
    body, header_length = http_request(inputs)
    return body, (("Content-Type", "application/octet-stream"),
                  ("Inference-Header-Content-Length", str(header_length)))


def probe(member: Member, copies: int) -> tuple[bytes, tuple[tuple[str, str], ...]]:
    """A body holding ``copies`` copies of one member's rows (to measure batching's cost)."""
    return pack([member] * copies)


def read_outputs(reply: UpstreamReply) -> dict[str, np.ndarray]:
    """The outputs of a batch's reply (NotCodable when they cannot be read)."""
    length = reply.headers.get("inference-header-content-length")
    header_length = int(length) if length and length.isdigit() else None
    return read_http_reply(reply.body, header_length)


def split(outputs: dict[str, np.ndarray], members: Sequence[Member]) -> list[UpstreamReply]:
    """Each member's answer: its rows of every batched output, in its own protocol.

    Each answer names the member's own app as its model (apps sharing a queue share batches).
    """
    total = sum(m.rows for m in members)
    replies = []
    start = 0
    for member in members:
        end = start + member.rows
        query = member.query
        assert query is not None  # noqa: S101
        mine = {name: (array[start:end] if array.ndim and array.shape[0] == total else array)
                for name, array in outputs.items()}
        app_id = member.request.app_id
        if query.protocol == "grpc":
            replies.append(UpstreamReply(200, {}, grpc_answer(query, mine, app_id,
                                                              MODEL_SOURCE)))
        else:
            body, header_length = http_answer(query, mine, app_id, MODEL_SOURCE)
            headers = {"content-type": "application/json"}
            if header_length is not None:
                headers = {"content-type": "application/octet-stream",
                           "inference-header-content-length": str(header_length)}
            replies.append(UpstreamReply(200, headers, body))
        start = end
    return replies


def exec_times(outputs: dict[str, np.ndarray], members: Sequence[Member], name: str
               ) -> dict[Hashable, float]:
    """Each member's execution time in seconds (its slowest row) from output ``name``, if any.

    Values that are not finite and non-negative are ignored; so is an output whose length is not
    the batch's rows.
    """
    array = outputs.get(name)
    total = sum(m.rows for m in members)
    if array is None or array.size != total:
        return {}
    flat = np.asarray(array, dtype=np.float64).reshape(-1)
    times: dict[Hashable, float] = {}
    start = 0
    for member in members:
        rows = flat[start:start + member.rows]
        start += member.rows
        if rows.size and np.all(np.isfinite(rows)) and np.all(rows >= 0):
            times[member.key] = float(rows.max()) / 1e6
    return times
