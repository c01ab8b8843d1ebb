"""Coding groups in the gateway (ParM §4.1): k dispatched queries, one parity query, one decode.

Queries of an app protected by parity models are sent to its instances at once, as without
coding, and each then joins an open *coding group* of its app, as it came (its tensors are read
only when the group is encoded, off the queries' way): the oldest open group with no query on
the same instance, so that the k queries of a group are on k separate instances (ParM §4.5,
Fig. 4; a group with two queries on one slow instance could rebuild neither), or a new group
when every open one has a query there. When the group holds k queries it is
encoded (``parity.coding``) into a parity query, sent to one of the app's parity models; nothing
waits for it. A group whose queries cannot be coded together (a tensor the gateway does not
read, different shapes) is closed unprotected. A group that does
not fill within the group timeout is closed unprotected, so no query ever waits for others to
arrive. When a member's prediction is unavailable, :meth:`Group.reconstruct` rebuilds it from
the parity model's output and the k - 1 others with the subtraction decoder, as soon as they
are all in.

ParM pays for its groups in waiting: a query on a slow instance whose group is not full cannot
be rebuilt before the next queries arrive (§6.2.2 names this wait as a cost of a larger k). So a
group still open when one of its queries is late (``gateway.protection`` asks) is *filled*
(:meth:`Coder.fill`) with stand-ins: queries of the app answered by the model shortly before,
whose outputs are known, so the subtraction decoder needs nothing more from them. The parity
model was trained on sums of any k queries of the data, so a stand-in codes like a member; the
cost is a parity query for a group that would otherwise have waited, only when a member is late.

This module keeps the groups and does the algebra around the wire formats; when a prediction
counts as unavailable, and what is sent where, is ``gateway.protection``'s.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from gateway.exchange import InferRequest
from gateway.tensors import (
    NotCodable,
    Query,
    grpc_answer,
    http_answer,
    read_reply,
    read_request,
)
from gateway.upstream import UpstreamReply
from parity.coding import CodingGroup, EncoderKind, decode, encode_group
from parity.errors import CodingError

logger = logging.getLogger(__name__)

ParitySend = Callable[["Group", dict[str, np.ndarray], Query], Awaitable[dict[str, np.ndarray]]]
"""Sends a group's parity query (inputs by name, the first member's query as a template);
returns the parity model's outputs, or raises when there are none."""


class CodingEvents(Protocol):
    """What coding reports (the metrics)."""

    def group_closed(self, app_id: str, outcome: str) -> None: ...


@dataclass(eq=False)
class Member:
    """One query of a group and, once it came, its own reply."""

    query_id: str
    request: InferRequest
    server_id: str = ""
    """The instance the query was sent to ('' when unknown)."""
    query: Query | None = None
    """Its tensors, read when the group is encoded."""
    reply: UpstreamReply | None = None
    reconstructed: bool = False
    stand_in: bool = False
    """A query answered before, put in to fill the group (its reply is its own)."""

    @property
    def protocol(self) -> str:
        """The protocol the query came in (its answer goes back in it)."""
        return self.request.protocol


@dataclass(eq=False)
class Group:
    """One coding group of an app, from its first query to its decode (or abandonment)."""

    group_id: str
    k: int
    encoder: EncoderKind
    signature: tuple[Any, ...]
    members: list[Member] = field(default_factory=list)
    parity_output: dict[str, np.ndarray] | None = None
    parity_server: str = ""
    closed: str = ""
    """Why no reconstruction will come: '' while one may (or did), else the reason."""
    _news: asyncio.Future[None] | None = None

    @property
    def full(self) -> bool:
        """Whether the group holds its k queries."""
        return len(self.members) >= self.k

    def takes(self, server_id: str) -> bool:
        """Whether a query sent to ``server_id`` may join (no member there yet)."""
        return not server_id or all(m.server_id != server_id for m in self.members)

    def news(self) -> asyncio.Future[None]:
        """Resolved at the group's next change (a reply, the parity output, its end)."""
        if self._news is None or self._news.done():
            self._news = asyncio.get_running_loop().create_future()
        return self._news

    def notify(self) -> None:
        """Wake whoever waits on :meth:`news`."""
        if self._news is not None and not self._news.done():
            self._news.set_result(None)

    def answered(self, query_id: str, reply: UpstreamReply) -> None:
        """A member's own (successful) reply came."""
        for member in self.members:
            if member.query_id == query_id:
                member.reply = reply
        self.notify()

    def close(self, reason: str) -> None:
        """No reconstruction will come for this group (first reason kept)."""
        if not self.closed:
            self.closed = reason
        self.notify()

    def hopeless(self, query_id: str) -> bool:
        """Whether a reconstruction of ``query_id`` can no longer come."""
        if self.closed:
            return True
        others = [m for m in self.members if m.query_id != query_id]
        return any(m.reconstructed for m in others)

    def decodable(self, query_id: str) -> bool:
        """Whether ``query_id`` can be rebuilt now: the parity output and the k - 1 others."""
        return (not self.closed and self.full and self.parity_output is not None
                and all(m.reply is not None for m in self.members if m.query_id != query_id))

    def reconstruct(self, query_id: str, model_name: str) -> UpstreamReply:
        """The rebuilt answer of ``query_id`` in its own protocol (CodingError, NotCodable)."""
        assert self.parity_output is not None  # noqa: S101 - checked by decodable()
        member = next(m for m in self.members if m.query_id == query_id)
        assert member.query is not None  # noqa: S101 - read when the group was encoded
        coding = CodingGroup(self.group_id, tuple(m.query_id for m in self.members))
        available: dict[str, dict[str, np.ndarray]] = {}
        for other in self.members:
            if other.query_id != query_id and other.reply is not None:
                available[other.query_id] = read_reply(other.protocol, other.reply.body,
                                                       other.reply.headers)
        wanted = member.query.outputs or tuple(self.parity_output)
        outputs: dict[str, np.ndarray] = {}
        for name in wanted:
            if name not in self.parity_output or any(name not in o for o in available.values()):
                raise NotCodable(f"output {name!r} missing from a reply of the group")
            rebuilt = decode(coding, self.parity_output[name],
                             {q: o[name] for q, o in available.items()})
            outputs[name] = rebuilt.output.astype(self.parity_output[name].dtype, copy=False)
        member.reconstructed = True
        self.notify()
        if member.protocol == "grpc":
            return UpstreamReply(200, {}, grpc_answer(member.query, outputs, model_name,
                                                      "reconstructed", self.group_id))
        body, header_length = http_answer(member.query, outputs, model_name, "reconstructed",
                                          self.group_id)
        headers = {"content-type": "application/json"}
        if header_length is not None:
            headers = {"content-type": "application/octet-stream",
                       "inference-header-content-length": str(header_length)}
        return UpstreamReply(200, headers, body)


def _query(member: Member) -> Query:
    """A member's tensors, read once (NotCodable when the gateway cannot read them)."""
    if member.query is None:
        member.query = read_request(member.protocol, member.request.body,
                                    member.request.headers)
    return member.query


def encode_members(group: Group) -> tuple[dict[str, np.ndarray], Query]:
    """The parity query's inputs of a full group (its members' tensors read here)."""
    queries = [_query(m) for m in group.members]
    signatures = {q.signature() for q in queries}
    if len(signatures) != 1:
        raise NotCodable(f"the queries' tensors differ: {sorted(signatures)}")
    coding = CodingGroup(group.group_id, tuple(m.query_id for m in group.members))
    first = queries[0]
    parity = {name: encode_group(coding, {m.query_id: q.inputs[name]
                                          for m, q in zip(group.members, queries, strict=True)},
                                 group.encoder).astype(first.inputs[name].dtype, copy=False)
              for name in first.inputs}
    return parity, first


STAND_INS_KEPT = 8
"""Answered queries an app keeps as possible stand-ins (the latest)."""


class Coder:
    """The coding groups of one app: joins queries, encodes full groups, closes stale ones."""

    _ids = itertools.count(1)

    def __init__(self, app_id: str, send_parity: ParitySend, group_timeout_s: float,
                 events: CodingEvents | None = None) -> None:
        self.app_id = app_id
        self.send_parity = send_parity
        self.group_timeout_s = group_timeout_s
        self.events = events
        self._open: dict[tuple[Any, ...], list[Group]] = {}
        """Open groups by (k, encoder), oldest first."""
        self._answered: deque[Member] = deque(maxlen=STAND_INS_KEPT)
        """Members the model answered lately, newest last: the stand-ins of :meth:`fill`."""
        self._tasks: set[asyncio.Task[None]] = set()

    def join(self, query_id: str, request: InferRequest, k: int, encoder: EncoderKind,
             server_id: str = "") -> Group:
        """Put a dispatched query into an open group; encode and send the group once full.

        The oldest open group without a query on ``server_id`` takes it; a new one when none
        does.
        """
        key = (k, encoder)
        groups = self._open.setdefault(key, [])
        group = next((g for g in groups if g.takes(server_id)), None)
        if group is None:
            group = Group(f"{self.app_id}-g{next(self._ids)}", k, encoder, key)
            groups.append(group)
            asyncio.get_running_loop().call_later(self.group_timeout_s, self._expire, group)
        group.members.append(Member(query_id, request, server_id))
        if group.full:
            groups.remove(group)
            self._start(group)
        return group

    def answered(self, group: Group, query_id: str, reply: UpstreamReply) -> None:
        """A member's own reply came: tell its group, and keep it as a possible stand-in."""
        group.answered(query_id, reply)
        if reply.status == 200:
            member = next((m for m in group.members if m.query_id == query_id), None)
            if member is not None and not member.stand_in:
                self._answered.append(member)

    def fill(self, group: Group) -> bool:
        """Fill an open group with stand-ins and send its parity query; whether it was.

        Stand-ins are the latest answered queries of the app with the group's tensor shapes
        (read here); none is used twice in one group. Not filled: the group is full or closed
        already, or too few stand-ins are at hand.
        """
        if group.full or group.closed:
            return False
        groups = self._open.get(group.signature, [])
        if group not in groups:
            return False
        try:
            wanted = _query(group.members[0]).signature()
        except NotCodable:
            return False
        taken = {m.query_id for m in group.members}
        stand_ins: list[Member] = []
        for member in reversed(self._answered):
            if len(group.members) + len(stand_ins) >= group.k:
                break
            if member.query_id in taken or member.reply is None:
                continue
            try:
                if _query(member).signature() != wanted:
                    continue
            except NotCodable:
                continue
            taken.add(member.query_id)
            stand_ins.append(Member(member.query_id, member.request, member.server_id,
                                    member.query, member.reply, stand_in=True))
        if len(group.members) + len(stand_ins) < group.k:
            return False
        group.members.extend(stand_ins)
        groups.remove(group)
        self._start(group)
        return True

    def _start(self, group: Group) -> None:
        task = asyncio.get_running_loop().create_task(self._encode_and_send(group))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _expire(self, group: Group) -> None:
        if group.full or group.closed:
            return
        groups = self._open.get(group.signature, [])
        if group in groups:
            groups.remove(group)
        group.close(f"the group timed out with {len(group.members)} of {group.k} queries")
        self._report("timeout")

    async def _encode_and_send(self, group: Group) -> None:
        try:
            parity, template = encode_members(group)
        except (CodingError, ValueError) as exc:  # NotCodable is a ValueError
            logger.debug("%s: group %s not encodable: %s", self.app_id, group.group_id, exc)
            group.close(f"not encodable: {exc}")
            self._report("unencodable")
            return
        self._report("filled" if any(m.stand_in for m in group.members) else "encoded")
        try:
            group.parity_output = await self.send_parity(group, parity, template)
        except asyncio.CancelledError:
            group.close("stopping")
            raise
        except Exception as exc:  # noqa: BLE001 - any failure leaves the group unprotected
            logger.debug("%s: parity query of %s failed: %s", self.app_id, group.group_id, exc)
            group.close(f"parity query failed: {exc}")
            return
        group.notify()

    def _report(self, outcome: str) -> None:
        if self.events is not None:
            self.events.group_closed(self.app_id, outcome)

    def close(self) -> None:
        """Cancel the parity queries in flight (the gateway stops)."""
        for task in self._tasks:
            task.cancel()
