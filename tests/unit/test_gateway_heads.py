"""Parsed HTTP heads are cached by their bytes, and each request gets headers of its own."""

from __future__ import annotations

import pytest

from gateway import http_server, upstream
from gateway.http_server import HttpError

HEAD = (b"POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n"
        b"Expect: 100-continue")


def test_a_repeated_request_head_is_parsed_once_and_not_shared() -> None:
    first = http_server._read_head(HEAD)
    assert HEAD in http_server._heads
    first.headers.pop("expect")  # what a request does to its own headers
    second = http_server._read_head(HEAD)
    assert second.headers["expect"] == "100-continue" and second.headers is not first.headers
    assert (second.method, second.target, second.headers["content-length"]) == (
        "POST", "/v2/models/a/infer", "10")


def test_a_malformed_head_is_refused_every_time() -> None:
    for _ in range(2):
        with pytest.raises(HttpError):
            http_server._read_head(b"GARBAGE\r\nHost: x")
    assert b"GARBAGE\r\nHost: x" not in http_server._heads


def test_the_cache_is_bounded() -> None:
    for i in range(http_server.HEAD_CACHE_ENTRIES + 10):
        http_server._read_head(b"GET /%d HTTP/1.1\r\nHost: x" % i)
    assert len(http_server._heads) <= http_server.HEAD_CACHE_ENTRIES


def test_reply_heads_are_cached_with_their_closing_flag() -> None:
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close"
    status, headers, closes = upstream._read_head(raw)
    headers["content-length"] = "9"
    assert upstream._read_head(raw) == (200, {"content-length": "4", "connection": "close"},
                                        True)
    assert upstream._read_head(b"HTTP/1.1 503 Unavailable\r\nContent-Length: 0")[::2] == (
        503, False)
    with pytest.raises(upstream.UpstreamError):
        upstream._read_head(b"SPDY 200")
