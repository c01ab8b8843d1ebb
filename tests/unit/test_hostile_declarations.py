"""A bad declaration in Redis is quarantined, not a 500 and not a failed hello.

The declaration log against a small in-memory stand-in for the Redis commands it uses (no
socket); the same against a real controller and Redis is in
``tests/integration/test_hostile_controller.py``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from redis.exceptions import ResponseError

from controller.declarations import Declaration, DeclarationLog


class MemoryRedis:
    """The strings and hashes of the commands the declaration log and quarantine use."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    def _hash(self, key: str) -> dict[str, str]:
        value = self.data.setdefault(key, {})
        if not isinstance(value, dict):
            raise ResponseError("WRONGTYPE Operation against a key holding the wrong kind")
        return value

    async def get(self, key: str) -> str | None:
        value = self.data.get(key)
        if isinstance(value, dict):
            raise ResponseError("WRONGTYPE Operation against a key holding the wrong kind")
        return value

    async def set(self, key: str, value: Any) -> None:
        self.data[key] = str(value)

    async def incrby(self, key: str, amount: int) -> int:
        try:
            value = int(self.data.get(key, 0)) + amount
        except ValueError:
            raise ResponseError("value is not an integer or out of range") from None
        self.data[key] = str(value)
        return value

    async def hget(self, key: str, field: str) -> str | None:
        return self._hash(key).get(field)

    async def hmget(self, key: str, fields: list[str]) -> list[str | None]:
        return [self._hash(key).get(f) for f in fields]

    async def hkeys(self, key: str) -> list[str]:
        return list(self._hash(key))

    async def hset(self, key: str, field: str | None = None, value: str | None = None,
                   mapping: dict[str, str] | None = None) -> None:
        self._hash(key).update({**({field: value} if field is not None else {}),
                                **(mapping or {})})

    async def hdel(self, key: str, field: str) -> None:
        self._hash(key).pop(field, None)

    async def delete(self, key: str) -> None:
        self.data.pop(key, None)

    async def rename(self, key: str, target: str) -> None:
        self.data[target] = self.data.pop(key)

    def pipeline(self, transaction: bool = True) -> Pipeline:
        return Pipeline(self)


class Pipeline:
    def __init__(self, redis: MemoryRedis) -> None:
        self.redis = redis
        self.queued: list[Any] = []

    async def __aenter__(self) -> Pipeline:
        return self

    async def __aexit__(self, *_: Any) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self.queued.append((name, args, kwargs))

    async def execute(self) -> list[Any]:
        return [await getattr(self.redis, name)(*args, **kwargs)
                for name, args, kwargs in self.queued]


def _declaration(seq: int, server_id: str = "s1") -> str:
    return Declaration(seq=seq, server_id=server_id, reason="missed heartbeats",
                       detected_at=10.0 * seq, last_seen=10.0 * seq - 0.1).model_dump_json()


def _quarantined(redis: MemoryRedis) -> dict[str, dict[str, Any]]:
    return {k: json.loads(v) for k, v in redis.data.get("us:quarantine", {}).items()}


def test_bad_entries_are_left_out_of_the_list_and_quarantined() -> None:
    redis = MemoryRedis()
    redis.data.update({"us:declaration_seq": "4", "us:declarations": {
        "1": _declaration(1), "2": "{not json", "3": _declaration(7),
        "4": json.dumps({"seq": 4, "server_id": "s2"})}})
    log = DeclarationLog(redis)
    listed = asyncio.run(log.list())
    assert [d.seq for d in listed] == [1]
    found = {q["field"]: q for q in _quarantined(redis).values()}
    assert set(found) == {"2", "3", "4"} and found["2"]["raw"] == "{not json"
    assert "its seq is 7" in found["3"]["reason"]
    assert set(redis.data["us:declarations"]) == {"1"}


def test_a_returning_server_whose_latest_declaration_is_bad_is_still_taken_back() -> None:
    redis = MemoryRedis()
    redis.data.update({"us:declaration_seq": "1", "us:declarations": {"1": "[1, 2]"},
                       "us:declaration_last": {"s1": "1"}})
    log = DeclarationLog(redis)
    asyncio.run(log.mark_alive("s1", 30.0, same_boot=True))  # raised before
    asyncio.run(log.update(1, apps_moved=["a"]))
    assert "1" not in redis.data["us:declarations"]
    assert [q["key"] for q in _quarantined(redis).values()] == ["us:declarations"]


def test_a_counter_that_is_no_number_is_set_again_from_the_entries() -> None:
    redis = MemoryRedis()
    redis.data.update({"us:declaration_seq": "five", "us:declarations": {
        "1": _declaration(1), "2": _declaration(2)}})
    log = DeclarationLog(redis)
    assert [d.seq for d in asyncio.run(log.list())] == [1, 2]
    added = asyncio.run(log.add(Declaration(server_id="s3", reason="connection closed",
                                            detected_at=40.0, last_seen=39.9)))
    assert added.seq == 3
    redis.data["us:declaration_seq"] = "garbage again"
    assert asyncio.run(log.add(Declaration(server_id="s3", reason="connection closed",
                                           detected_at=50.0, last_seen=49.9))).seq == 4
    assert [q["key"] for q in _quarantined(redis).values()] == ["us:declaration_seq"] * 2


def test_a_key_of_the_wrong_type_is_set_aside() -> None:
    redis = MemoryRedis()
    redis.data.update({"us:declaration_seq": {"not": "a string"},
                       "us:declaration_last": "not a hash"})
    log = DeclarationLog(redis)
    assert asyncio.run(log.list()) == []
    assert asyncio.run(log.latest("s1")) is None
    assert {k.split(":")[2] for k in redis.data if k.startswith("us:quarantine:")} == {
        "declaration_seq", "declaration_last"}
