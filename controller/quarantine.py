"""Where the store moves what it finds in Redis and cannot use: out of the way, kept, logged.

A record that does not parse, or breaks the rules of ``controller.records`` (a NaN capacity
written by an older controller, an empty server id, a hand edit gone wrong), used to make every
read of its hash fail and the controller fail at start-up until Redis was cleaned by hand. The
store now moves such a record here, logs the key and the reason, and goes on without it.

Redis keys (under the store's prefix): ``quarantine`` hash ``<key>:<field>:<tag>`` -> JSON with
the key, the field, the reason, when, and the raw value (so an operator can repair and restore
it); a whole key of the wrong type (a string where a hash belongs) is renamed to
``quarantine:<key>:<tag>``.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Bad:
    """One value found unusable: the field of a hash (or ``None`` for a whole string key)."""

    field: str | None
    raw: str
    reason: str


class Quarantine:
    """Moves unusable values out of the store's keys (the store decides what is unusable)."""

    def __init__(self, redis: Any, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix
        self.key = f"{prefix}quarantine"

    def _entry(self, name: str, bad: Bad) -> tuple[str, str]:
        tag = uuid.uuid4().hex[:8]
        where = f"{name}:{bad.field}" if bad.field is not None else name
        body = {"key": self.prefix + name, "field": bad.field, "reason": bad.reason,
                "at": time.time(), "raw": bad.raw}
        return f"{where}:{tag}", json.dumps(body, ensure_ascii=False)

    def _logged(self, name: str, found: Sequence[Bad]) -> None:
        for bad in found:
            logger.error("quarantined %s%s%s: %s (kept in %s)", self.prefix, name,
                         f" field {bad.field[:128]!r}" if bad.field is not None else "",
                         bad.reason, self.key)

    async def fields(self, name: str, found: Sequence[Bad],
                     also: Callable[[Any], None] | None = None) -> list[Any]:
        """Move bad fields of hash ``name`` here, in one transaction with ``also``'s commands.

        Returns the results of ``also``'s commands.
        """
        async with self.redis.pipeline(transaction=True) as pipe:
            for bad in found:
                pipe.hset(self.key, *self._entry(name, bad))
                pipe.hdel(self.prefix + name, bad.field)
            if also is not None:
                also(pipe)
            results = await pipe.execute()
        self._logged(name, found)
        return list(results[2 * len(found):])

    async def stream_entries(self, name: str, found: Sequence[Bad]) -> None:
        """Move bad entries of stream ``name`` here (``field`` is the entry id)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            for bad in found:
                pipe.hset(self.key, *self._entry(name, bad))
                pipe.xdel(self.prefix + name, bad.field)
            await pipe.execute()
        self._logged(name, found)

    async def value(self, name: str, bad: Bad) -> None:
        """Move the string key ``name`` here."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.key, *self._entry(name, bad))
            pipe.delete(self.prefix + name)
            await pipe.execute()
        self._logged(name, [bad])

    async def set_aside(self, name: str, reason: str) -> None:
        """Rename key ``name``, of a type the store does not expect, out of the way."""
        target = f"{self.key}:{name}:{uuid.uuid4().hex[:8]}"
        await self.redis.rename(self.prefix + name, target)
        logger.error("quarantined %s%s: %s (renamed to %s)", self.prefix, name, reason, target)

    async def tolerant(self, name: str, read: Callable[[], Awaitable[Any]]) -> Any:
        """``read()`` of key ``name``; a key of another type is set aside and read again."""
        try:
            return await read()
        except ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            await self.set_aside(name, str(exc))
            return await read()

    async def entries(self) -> dict[str, dict[str, Any]]:
        """Everything quarantined, by entry name."""
        raw = await self.redis.hgetall(self.key)
        return {k: json.loads(v) for k, v in raw.items()}


def json_object(raw: str) -> dict[str, Any] | None:
    """``raw`` parsed when it is a JSON object, else None."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None
