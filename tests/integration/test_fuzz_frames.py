"""Property-based fuzzing of the agent and event websockets of a real controller and Redis.

Hypothesis writes the frames as JSON text, so that they can hold what no JSON library writes:
NaN and infinities, numbers past a double, truncated objects, ids of every length and script,
wrong types, unknown kinds, frames out of order and frames over the protocol's size limit.

* A hostile first frame on an agent connection (every hello that breaks a bound, or any other
  frame first) is refused: the connection closes with 1008 (1009 for a frame over the limit)
  and a reason, and Redis holds exactly what it held before.
* After a valid hello, frames of kinds the controller does not know are skipped, frames out of
  order (a second hello claiming another server, a result for no command) change nothing, and
  the first invalid frame closes the connection naming itself: nothing it said reaches Redis
  (the server's record keeps what its hello said; no other record changes).
* The event stream refuses bad query parameters at the handshake and closes on any frame (1008,
  1009 over the limit), changing nothing.

After all of it the controller has not crashed: it still runs, /readyz is 200, every record
reads back and nothing was quarantined. ``UNDERSTUDY_FUZZ_EXAMPLES`` scales the example counts
(the defaults keep ``make test`` short); the runs are derandomised.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from controller.credentials import CredentialStore
from controller.redis_server import RedisServer
from deploy.sim_driver import ControllerProcess
from deploy.testbed import wait_until
from understudy.wire.credentials import bearer
from understudy.wire.protocol import AGENT_WS_PATH, MAX_FRAME_BYTES

pytestmark = pytest.mark.timeout(300)
SCALE = int(os.environ.get("UNDERSTUDY_FUZZ_EXAMPLES", "30")) / 150
FUZZ = settings(deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=list(HealthCheck))
RECV_TIMEOUT_S = 30.0
"""How long a refusal may take to arrive (the controller answers in milliseconds; this only
ends a test that would otherwise hang)."""
PREFIX = "us:"
AGENT = "fz-agent"
"""The server the fuzzing agent speaks for after a valid hello."""
ENDPOINTS = {"http": "127.0.0.1:1", "grpc": "127.0.0.1:2"}
CAPACITY = {"memory_mb": 4000.0, "compute": 100.0}
VOLATILE = {"events", "event_seq", "declarations", "declaration_seq", "declaration_last", "rev"}
"""Keys a closed agent connection changes by itself (its server's failure declaration); the warm
plan is re-solved when its server comes and goes."""


def _examples(default: int) -> int:
    return max(1, int(default * SCALE))


@dataclass
class Running:
    process: ControllerProcess
    redis: redis.Redis
    ws_url: str
    agent: dict[str, str]
    """The fuzzing agent's credential (bound to :data:`AGENT`)."""


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    run_dir = tmp_path_factory.mktemp("fuzz-frames")
    server = RedisServer(run_dir / "redis")
    server.start()
    process = ControllerProcess(run_dir, log_level="WARNING", extra=[
        "--redis-url", server.redacted_url, "--redis-password-file", str(server.password_file),
        "--startup-grace-s", "3600"])
    client = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        process.wait_ready()
        # A record of our own for hostile frames to corrupt (no app: the fuzzing agent's
        # server would be given it, and it would move at every close).
        assert process.http.patch("/v1/config", json={"failback": False}).status_code == 200
        wait_until("the records to settle", lambda: _dump(client) == _dump(client, delay_s=0.3),
                   30)
        assert process.credentials is not None
        agent = bearer(CredentialStore(process.credentials).agent_token(AGENT))
        yield Running(process, client, f"ws://127.0.0.1:{process.port}", agent)
    finally:
        process.stop()
        server.stop()


def _dump(client: redis.Redis, skip: frozenset[str] = frozenset(),
          delay_s: float = 0.0) -> dict[str, Any]:
    """Every record under the controller's prefix, as plain values (read after ``delay_s``)."""
    time.sleep(delay_s)
    found: dict[str, Any] = {}
    for key in sorted(client.scan_iter(f"{PREFIX}*")):
        name = key.removeprefix(PREFIX)
        if name in skip or name.startswith("idempotency:"):
            continue
        kind = client.type(key)
        found[name] = (client.hgetall(key) if kind == "hash" else client.get(key)
                       if kind == "string" else client.xrange(key) if kind == "stream"
                       else kind)
    return found


def _closed(ws: ClientConnection, frames: list[str | bytes]) -> tuple[int | None, str]:
    """Send ``frames``; the close code and reason the controller ends the connection with."""
    try:
        for frame in frames:
            ws.send(frame)
        while True:
            ws.recv(timeout=RECV_TIMEOUT_S)
    except ConnectionClosed as closed:
        return (closed.rcvd.code, closed.rcvd.reason) if closed.rcvd else (None, "")
    except TimeoutError:
        return None, "still open"


# --- frames as JSON text ------------------------------------------------------------------------

def _text(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


NON_FINITE = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e309", "-1e309"])
WRONG_TYPES = st.sampled_from(["null", "[]", "{}", "true", '"x"', '[1, 2]', '{"a": 1}'])
BAD_ID_STRINGS = st.one_of(
    st.sampled_from(['""', '" "', '"a/b"', '"*"', '"../etc"', '"a b"', '"_lead"', '"-lead"',
                     '"a\\u0000b"', '"a\\nb"']),
    st.integers(129, 100_000).map(lambda n: _text("s" * n)),
    st.text(st.characters(min_codepoint=0x80), min_size=1, max_size=40).map(_text))
"""Ids as JSON strings that no id may be: empty, unsafe characters, too long, non-ASCII."""
BAD_IDS = st.one_of(BAD_ID_STRINGS, st.integers(-5, 5).map(str),
                    WRONG_TYPES.filter(lambda v: v != '"x"'), NON_FINITE)
BAD_AMOUNTS = st.one_of(NON_FINITE, st.sampled_from(["-1", "-1e-300", "1e10", "1e308",
                                                     '"much"', "null", "[]", "{}"]),
                        st.integers(10**9 + 1, 10**30).map(str))
BAD_CAPACITIES = st.one_of(
    BAD_AMOUNTS.map(lambda v: f'{{"memory_mb": {v}}}'),
    BAD_ID_STRINGS.map(lambda k: f"{{{k}: 1.0}}"),
    st.integers(33, 200).map(lambda n: json.dumps({f"r{i}": 1.0 for i in range(n)})),
    NON_FINITE, st.sampled_from(["[]", '"memory"', "null", "5"]))
BAD_TIMES = st.one_of(NON_FINITE, st.sampled_from(["-1", "1e12", '"now"', "null", "[]"]))
BAD_INTERVALS = st.one_of(NON_FINITE, st.sampled_from(["5e-324", "0", "-20", "0.5", "60001",
                                                       "1e300", '"often"', "null"]))
HELLO_FIELDS: dict[str, str] = {
    "v": "1", "type": '"hello"', "server_id": _text(AGENT), "site_id": '"site-f"',
    "capacity": json.dumps(CAPACITY), "endpoints": json.dumps(ENDPOINTS),
    "heartbeat_interval_ms": "20.0", "boot_id": '"boot-1"'}
BAD_HELLO_VALUES: dict[str, st.SearchStrategy[str]] = {
    "v": st.sampled_from(["2", "0", '"1"', "null", "1.5", "NaN"]),
    "type": st.sampled_from(['"helo"', '""', "null", "5", '"HELLO"']),
    "server_id": BAD_IDS, "site_id": BAD_IDS, "capacity": BAD_CAPACITIES,
    "endpoints": st.one_of(
        st.sampled_from(['{"http": ""}', '{"http": "a b", "grpc": "x"}', '"x"', "5"]),
        st.integers(2049, 20_000).map(lambda n: json.dumps({"http": "h" * n, "grpc": "g"}))),
    "heartbeat_interval_ms": BAD_INTERVALS,
    "boot_id": st.one_of(st.sampled_from(['"a b"', '"x/y"', "5", "[]"]),
                         st.integers(129, 5000).map(lambda n: _text("b" * n))),
    "agent_pid": st.sampled_from(["0", "-1", "2147483648", "1.5", "NaN", '"pid"']),
    "inventory": st.one_of(
        st.sampled_from(['"all"', "5", '[{"model_name": "a__b"}]',
                         '[{"model_name": "x", "app_id": "a", "variant": "b", '
                         '"state": "ready"}]',
                         '[{"model_name": "a__b", "app_id": "a", "variant": "b", '
                         '"state": "ready", "memory_mb": NaN}]']),
        st.integers(4097, 5000).map(lambda n: "[" + ",".join(["{}"] * n) + "]")),
    "triton_alive": st.sampled_from(['"maybe"', "2", "null", "[]"]),
}


def _object(fields: dict[str, str]) -> str:
    return "{" + ", ".join(f"{_text(k)}: {v}" for k, v in fields.items()) + "}"


@st.composite
def bad_hellos(draw: st.DrawFn) -> str:
    """A hello with one to three fields broken."""
    fields = dict(HELLO_FIELDS)
    for name in draw(st.lists(st.sampled_from(sorted(BAD_HELLO_VALUES)), min_size=1,
                              max_size=3, unique=True)):
        fields[name] = draw(BAD_HELLO_VALUES[name])
    if draw(st.booleans()):
        fields["extra"] = draw(st.sampled_from(['"ignored"', "NaN", "[" * 20 + "]" * 20]))
    return _object(fields)


GOOD_HELLO = _object(HELLO_FIELDS)
OTHER_FRAMES = [  # well-formed frames that must not come first
    '{"v": 1, "type": "result", "command_id": "c1", "ok": true}',
    '{"v": 1, "type": "triton_down", "at": 1.0}',
    '{"v": 1, "type": "triton_up", "at": 1.0, "endpoints": {"http": "h:1", "grpc": "h:2"}}',
    '{"v": 1, "type": "replica_exited", "graph": "g", "node": "n", "at": 1.0}',
]
MALFORMED = st.one_of(
    st.integers(1, len(GOOD_HELLO) - 1).map(lambda n: GOOD_HELLO[:n]),  # truncated
    st.sampled_from(["[]", "5", '"hello"', "null", "", " ", "{", "}", "[" * 50_000]),
    st.binary(min_size=1, max_size=300),
    st.text(max_size=200).filter(lambda t: not t.strip().startswith("{")))
FIRST_FRAMES = st.one_of(bad_hellos(), MALFORMED, st.sampled_from(OTHER_FRAMES),
                         st.sampled_from(OTHER_FRAMES).map(lambda f: f + GOOD_HELLO))


@given(frame=FIRST_FRAMES)
@settings(FUZZ, max_examples=_examples(1000))
def test_a_hostile_first_frame_is_refused_and_changes_nothing(
        running: Running, frame: str | bytes) -> None:
    before = _dump(running.redis)
    with connect(running.ws_url + AGENT_WS_PATH, additional_headers=running.agent, max_size=None,
                 open_timeout=RECV_TIMEOUT_S) as ws:
        code, reason = _closed(ws, [frame])
    assert code == 1008 and reason, (code, reason)
    assert _dump(running.redis) == before


def test_a_frame_over_the_limit_is_refused_with_1009(running: Running) -> None:
    before = _dump(running.redis)
    huge = GOOD_HELLO[:-1] + ', "boot_id": "' + "b" * MAX_FRAME_BYTES + '"}'
    with connect(running.ws_url + AGENT_WS_PATH, additional_headers=running.agent,
                 max_size=None) as ws:
        code, _ = _closed(ws, [huge])
    assert code == 1009
    assert _dump(running.redis) == before


# --- after a valid hello ------------------------------------------------------------------------

BAD_LATER_FRAMES = st.one_of(
    BAD_TIMES.map(lambda t: f'{{"v": 1, "type": "triton_down", "at": {t}}}'),
    st.sampled_from(["2147483648", "1.5", '"nine"', "NaN"]).map(
        lambda c: f'{{"v": 1, "type": "triton_down", "at": 1.0, "exit_code": {c}}}'),
    st.integers(4097, 6000).map(
        lambda n: '{"v": 1, "type": "triton_down", "at": 1.0, "lost_models": ['
                  + ",".join(['"a__b"'] * n) + "]}"),
    BAD_TIMES.map(lambda t: '{"v": 1, "type": "triton_up", "at": ' + t
                  + ', "endpoints": {"http": "h:1", "grpc": "h:2"}}'),
    st.sampled_from(['{"http": ""}', '"x"', "null", '{"http": "a b", "grpc": "c"}']).map(
        lambda e: f'{{"v": 1, "type": "triton_up", "at": 1.0, "endpoints": {e}}}'),
    st.one_of(NON_FINITE, st.sampled_from(["-1", "1e7", '"fast"'])).map(
        lambda d: '{"v": 1, "type": "result", "command_id": "c9", "ok": true, '
                  f'"timings": {{"load_s": {d}}}}}'),
    st.sampled_from(['"x" ', "null", "1", '"' + "c" * 129 + '"']).map(
        lambda c: f'{{"v": 1, "type": "result", "command_id": {c}, "ok": "maybe"}}'),
    BAD_IDS.map(lambda g: f'{{"v": 1, "type": "replica_exited", "graph": {g}, "node": "n", '
                          f'"at": 1.0}}'),
    st.sampled_from(["2", '"1"', "null"]).map(lambda v: f'{{"v": {v}, "type": "triton_down", '
                                                        '"at": 1.0}'),
    MALFORMED)
SKIPPED_OR_IGNORED = st.one_of(
    st.from_regex(r"\A[a-z][a-z_]{0,20}\Z").filter(
        lambda k: k not in {"hello", "result", "triton_down", "triton_up", "replica_exited"}
    ).map(lambda k: f'{{"v": 1, "type": "{k}", "payload": [1, 2, 3]}}'),  # unknown kinds
    st.just('{"v": 1, "type": "result", "command_id": "never-sent", "ok": true}'),
    st.sampled_from(["fz-other", AGENT]).map(
        lambda s: GOOD_HELLO.replace(_text(AGENT), _text(s)).replace(
            json.dumps(CAPACITY), '{"memory_mb": 1.0}')))  # a second hello, out of order


@given(ignored=st.lists(SKIPPED_OR_IGNORED, max_size=3), bad=BAD_LATER_FRAMES)
@settings(FUZZ, max_examples=_examples(400))
def test_after_a_hello_invalid_frames_close_the_connection_and_change_nothing(
        running: Running, ignored: list[str], bad: str | bytes) -> None:
    before = _dump(running.redis, frozenset(VOLATILE | {"servers", "plan"}))
    servers_before = set(running.redis.hkeys(f"{PREFIX}servers"))
    with connect(running.ws_url + AGENT_WS_PATH, additional_headers=running.agent, max_size=None,
                 open_timeout=RECV_TIMEOUT_S) as ws:
        ws.send(GOOD_HELLO)
        channel = json.loads(ws.recv(timeout=RECV_TIMEOUT_S))
        assert channel["type"] == "heartbeat_channel"
        code, reason = _closed(ws, [*ignored, bad])
    assert code == 1008 and reason.startswith("bad frame"), (code, reason)
    # The close declares the server failed (as a real agent's would): wait for its failover
    # to end (its intent is written first and deleted last).
    wait_until("the failover of the closed agent's server", lambda: json.loads(
        running.redis.hget(f"{PREFIX}servers", AGENT))["state"] == "failed"
        and not running.redis.exists(f"{PREFIX}intents"), 30, 0.01)
    assert _dump(running.redis, frozenset(VOLATILE | {"servers", "plan"})) == before
    assert set(running.redis.hkeys(f"{PREFIX}servers")) <= servers_before | {AGENT}
    record = json.loads(running.redis.hget(f"{PREFIX}servers", AGENT))
    assert (record["site_id"], record["capacity"], record["http"], record["grpc"]) == \
        ("site-f", CAPACITY, ENDPOINTS["http"], ENDPOINTS["grpc"])


# --- the event stream ---------------------------------------------------------------------------

QUERY_VALUES = st.one_of(
    st.integers(-(2**70), 2**70).map(str), NON_FINITE, st.text(max_size=50),
    st.integers(129, 3000).map(lambda n: "x" * n), st.sampled_from(["", "1.5", "-0", "0x10"]))


@given(since=st.none() | QUERY_VALUES, app_id=st.none() | QUERY_VALUES,
       frame=st.none() | st.text(max_size=300) | st.binary(max_size=300))
@settings(FUZZ, max_examples=_examples(500))
def test_the_event_stream_takes_no_frames_and_changes_nothing(
        running: Running, since: str | None, app_id: str | None,
        frame: str | bytes | None) -> None:
    from urllib.parse import urlencode

    before = _dump(running.redis, frozenset(VOLATILE | {"plan"}))  # settling after the agents
    query = urlencode({k: v for k, v in (("since", since), ("app_id", app_id))
                       if v is not None})
    try:
        ws = connect(f"{running.ws_url}/v1/events/ws?{query}", max_size=None,
                     additional_headers=running.process.auth, open_timeout=RECV_TIMEOUT_S)
    except InvalidStatus as refused:  # bad query parameters: refused at the handshake
        assert refused.response.status_code == 403, refused.response
    else:
        with ws:
            if frame is not None:
                code, reason = _closed(ws, [frame])
                assert (code, reason) == (1008, "the event stream takes no frames")
    assert _dump(running.redis, frozenset(VOLATILE | {"plan"})) == before


def test_after_the_fuzzing_the_controller_serves_and_stored_nothing_invalid(
        running: Running) -> None:
    # Runs last in this module (pytest keeps the file's order).
    http = running.process.http
    assert running.process.popen.poll() is None, "the controller crashed"
    assert http.get("/readyz").status_code == 200
    assert http.get("/v1/servers").status_code == 200 and http.get("/v1/apps").status_code == 200
    assert running.redis.hlen(f"{PREFIX}quarantine") == 0
    assert "Traceback" not in running.process.log_path.read_text()
    # ... and it still stops when told to (it once waited forever for the refused
    # connections to close): SIGINT, then the process gone within the graceful bound.
    import signal
    import subprocess

    from understudy.cli.controller import GRACEFUL_SHUTDOWN_S

    running.process.popen.send_signal(signal.SIGINT)
    try:
        running.process.popen.wait(GRACEFUL_SHUTDOWN_S + 7)
    except subprocess.TimeoutExpired:
        pytest.fail("the controller did not stop within 10 s of SIGINT after the fuzzing")
    # ... and not because the bound cut it short: every connection's handler had ended (event
    # streams whose sender's cancellation was lost in a Redis read once lingered until it).
    assert "timeout graceful shutdown exceeded" not in running.process.log_path.read_text()
