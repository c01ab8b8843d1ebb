"""Every failure declaration the controller made, true or false, with the apps it moved.

An operator (and every report and benchmark) must see each declaration, not only those that
were real failures: a false alarm that moved healthy apps costs their clients an outage and
some accuracy. The controller cannot always know which declarations were false, but it knows
the ones it later found alive: a declared server heard from again on the same connection, or
returning with the same agent boot (nothing restarted: it was alive all along). Both are kept
with the declaration (``alive_again``, ``same_boot``).

Redis keys (under the store's prefix): ``declarations`` hash seq -> :class:`Declaration` JSON,
``declaration_seq`` counter, ``declaration_last`` hash server -> seq of its latest one.

What a read finds and cannot use (an entry that does not parse, a counter that is no number, a
key of the wrong type) is quarantined as the store does with its records
(``controller.quarantine``) and left out: one bad entry used to make ``GET /v1/declarations``
answer 500, and an agent's hello fail when its server's latest declaration was the bad one.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from redis.exceptions import ResponseError

from controller.quarantine import Bad, Quarantine
from controller.record_cache import reason_of

logger = logging.getLogger(__name__)

MAX_LISTED = 1000


class Declaration(BaseModel):
    """One server declared failed."""

    model_config = ConfigDict(extra="ignore")

    seq: int = 0
    server_id: str
    site_id: str = ""
    reason: str
    detected_at: float
    last_seen: float
    """The server's last sign of life before the declaration (wall time)."""
    boot_id: str = ""
    apps_affected: list[str] = Field(default_factory=list)
    """Apps served or backed up on the server when it was declared."""
    apps_moved: list[str] = Field(default_factory=list)
    """Apps whose serving location changed because of this declaration."""
    cancelled: bool = False
    """Heard from again before the failover began: nothing was moved."""
    alive_again: float | None = None
    """When the controller heard from it again without a restart (wall time)."""
    same_boot: bool | None = None
    """On its return: True when its agent had not restarted (the server never died)."""


class DeclarationLog:
    """The declarations in Redis (the controller is the only writer)."""

    def __init__(self, redis: Any, prefix: str = "us:") -> None:
        self.redis = redis
        self.key = f"{prefix}declarations"
        self.seq_key = f"{prefix}declaration_seq"
        self.last_key = f"{prefix}declaration_last"
        self._lock = asyncio.Lock()
        self.quarantine = Quarantine(redis, prefix)

    async def add(self, declaration: Declaration) -> Declaration:
        """Store a new declaration; returns it with its sequence number."""
        return (await self.add_many([declaration]))[0]

    async def add_many(self, declarations: list[Declaration]) -> list[Declaration]:
        """Store several new declarations (a site's) in two round trips, numbered in order."""
        if not declarations:
            return []
        try:
            last = int(await self.redis.incrby(self.seq_key, len(declarations)))
        except ResponseError:
            await self._top()  # a counter that is no number: repaired, then numbered again
            last = int(await self.redis.incrby(self.seq_key, len(declarations)))
        stored = [d.model_copy(update={"seq": last - len(declarations) + 1 + i})
                  for i, d in enumerate(declarations)]
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.key, mapping={str(d.seq): d.model_dump_json() for d in stored})
            pipe.hset(self.last_key, mapping={d.server_id: str(d.seq) for d in stored})
            await pipe.execute()
        return stored

    async def update(self, seq: int, **fields: Any) -> None:
        """Set some fields of a stored declaration, keeping every other field as stored.

        Writers change different fields (the failover its moved apps, a revival its
        ``alive_again``) at different times: each re-reads the record under one lock, so no
        write loses another's field.
        """
        async with self._lock:
            stored = await self._read(str(seq))
            if stored is None:
                return
            await self.redis.hset(self.key, str(seq),
                                  stored.model_copy(update=fields).model_dump_json())

    async def latest(self, server_id: str) -> Declaration | None:
        """The server's most recent declaration."""
        seq = await self.quarantine.tolerant(
            "declaration_last", lambda: self.redis.hget(self.last_key, server_id))
        return await self._read(seq) if seq is not None else None

    async def mark_alive(self, server_id: str, at: float, same_boot: bool | None) -> None:
        """The server's latest declaration turned out alive (or returned: ``same_boot``)."""
        declaration = await self.latest(server_id)
        if declaration is None or declaration.alive_again is not None or \
                declaration.same_boot is not None:
            return
        if same_boot is None:
            await self.update(declaration.seq, alive_again=at)
        else:
            await self.update(declaration.seq, same_boot=same_boot,
                              alive_again=at if same_boot else None)

    async def list(self, since: int = 0, limit: int = MAX_LISTED) -> list[Declaration]:
        """Declarations with ``seq > since``, oldest first, at most ``limit``."""
        top = await self._top()
        seqs = [str(s) for s in range(since + 1, min(top, since + limit) + 1)]
        if not seqs:
            return []
        raws = await self.quarantine.tolerant("declarations",
                                              lambda: self.redis.hmget(self.key, seqs))
        found = await self._parsed(dict(zip(seqs, raws, strict=True)))
        return [found[seq] for seq in seqs if seq in found]

    async def _read(self, seq: str) -> Declaration | None:
        """One stored declaration (None when there is none, or it was quarantined)."""
        raw = await self.quarantine.tolerant("declarations",
                                             lambda: self.redis.hget(self.key, seq))
        return (await self._parsed({seq: raw})).get(seq)

    async def _parsed(self, raws: dict[str, str | None]) -> dict[str, Declaration]:
        """The entries that parse (and carry their own number); the others are quarantined."""
        found: dict[str, Declaration] = {}
        bad: list[Bad] = []
        for seq, raw in raws.items():
            if raw is None:
                continue
            try:
                declaration = Declaration.model_validate_json(raw)
            except ValueError as exc:
                bad.append(Bad(seq, raw, reason_of(exc)))
                continue
            if str(declaration.seq) != seq:
                bad.append(Bad(seq, raw, f"stored as {seq} but its seq is {declaration.seq}"))
                continue
            found[seq] = declaration
        if bad:
            await self.quarantine.fields("declarations", bad)
        return found

    async def _top(self) -> int:
        """The newest declaration's number.

        A counter that is no number is quarantined and set again from the numbers stored (left
        as it was, every new declaration failed: INCRBY refuses it).
        """
        raw = await self.quarantine.tolerant("declaration_seq",
                                             lambda: self.redis.get(self.seq_key))
        try:
            top = int(raw or 0)
        except ValueError:
            top = -1
        if top >= 0:
            return top
        await self.quarantine.value("declaration_seq", Bad(None, str(raw), "not a number"))
        numbers = [int(k) for k in await self.redis.hkeys(self.key) if k.isdigit()]
        top = max(numbers, default=0)
        await self.redis.set(self.seq_key, top)
        return top
