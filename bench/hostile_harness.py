"""The harness of ``bench/hostile.py``: a controller on a Redis of its own, and the tally.

:class:`Bench` starts both, dumps the controller's records to compare them around a refused
input, and checks that the controller still serves after each group; :class:`Tally` counts the
cases and what went wrong. The rest are ways to send what no polite client sends: frames as
JSON text (:func:`exchange`), raw request lines (:func:`raw`).
"""

from __future__ import annotations

import http.client
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from controller.credentials import CredentialStore
from controller.redis_server import RedisServer
from deploy.sim_driver import ControllerProcess, SimAgentProcesses
from understudy.wire.artifacts import Manifest
from understudy.wire.credentials import bearer, read_token_file
from understudy.wire.protocol import AGENT_WS_PATH

HOSTILE_AGENT = "h-1"
"""The server whose agent credential the hostile hellos are sent with."""
PREFIX = "us:"
VOLATILE = frozenset({"events", "event_seq", "declarations", "declaration_seq", "rev", "plan"})
"""Keys the controller changes by itself (events, declarations, the warm plan, the revision)."""
CAPACITY = '{"memory_mb": 16000.0, "compute": 100.0}'
VARIANTS = {"mobilenet_v3": ("mobilenet_v3_small", "mobilenet_v3_large")}
MAX_FAILURES_SHOWN = 20


@dataclass
class Tally:
    """Every case and what went wrong."""

    cases: int = 0
    crashes: int = 0
    http_5xx: int = 0
    state_corruptions: int = 0
    groups: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    group: str = ""

    def check(self, ok: bool, what: str, *, corruption: bool = False) -> bool:
        """One case; a failed one is recorded (as a state corruption when ``corruption``)."""
        self.cases += 1
        self.groups[self.group] += 1
        if not ok:
            self.state_corruptions += corruption
            if len(self.failures) < MAX_FAILURES_SHOWN:
                self.failures.append(f"{self.group}: {what}"[:300])
            print(f"  FAILED {self.group}: {what[:300]}", flush=True)
        return ok

    def answer(self, response: httpx.Response | tuple[int, bytes], expected: set[int],
               what: str) -> bool:
        """An HTTP answer: a 5xx is counted as such, any other unexpected status fails too."""
        status = response[0] if isinstance(response, tuple) else response.status_code
        if status >= 500:
            self.http_5xx += 1
        return self.check(status in expected, f"{what}: {status} (expected {sorted(expected)})")


class Bench:
    """The controller, its Redis, and the tally."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.artifacts = artifact_store(run_dir / "artifacts")
        self.redis_server = RedisServer(run_dir / "redis", appendfsync="always")
        self.redis_server.start()
        self.redis = redis.Redis.from_url(self.redis_server.url, decode_responses=True)
        self.tally = Tally()
        self.controller = self._start_controller()
        assert self.controller.credentials is not None  # noqa: S101 - not --insecure
        self.store = CredentialStore(self.controller.credentials)
        self.admin = self.controller.auth
        """The admin credential's header."""
        self.agents: SimAgentProcesses | None = None
        """The simulated agents (from the impersonation group on)."""

    def agent(self, server_id: str) -> dict[str, str]:
        """The header of ``server_id``'s agent credential."""
        return bearer(self.store.agent_token(server_id))

    def named(self, name: str) -> dict[str, str]:
        """The header of a named credential (``read``, ``client``, ``gateway``, ``admin``)."""
        return bearer(read_token_file(self.store.token_path(name)))

    def _start_controller(self, port: int = 0) -> ControllerProcess:
        # The credential store is made in run_dir on the first start and kept by a restart;
        # a restart takes the same port, where the agents look for their controller.
        process = ControllerProcess(self.run_dir, log_level="WARNING", port=port, extra=[
            "--redis-url", self.redis_server.redacted_url, "--redis-password-file",
            str(self.redis_server.password_file), "--startup-grace-s", "5",
            "--artifacts", str(self.artifacts)])
        process.wait_ready()
        return process

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.controller.port}"

    def dump(self) -> dict[str, Any]:
        """Every record under the controller's prefix but the volatile ones."""
        found: dict[str, Any] = {}
        for key in sorted(self.redis.scan_iter(f"{PREFIX}*")):
            name = key.removeprefix(PREFIX)
            if name in VOLATILE or name.startswith("idempotency:"):
                continue
            kind = self.redis.type(key)
            found[name] = (self.redis.hgetall(key) if kind == "hash" else
                           self.redis.get(key) if kind == "string" else kind)
        return found

    def unchanged(self, before: dict[str, Any], what: str) -> bool:
        after = self.dump()
        changed = sorted(k for k in before.keys() | after.keys()
                         if before.get(k) != after.get(k))
        return self.tally.check(not changed, f"{what} changed {changed}", corruption=True)

    def alive(self) -> None:
        """After each group: the controller still runs and is ready."""
        process = self.controller.popen
        ready = False
        if process.poll() is None:
            try:
                ready = self.controller.http.get("/readyz", timeout=10).status_code == 200
            except httpx.HTTPError:
                ready = False
        self.tally.crashes += not ready
        self.tally.check(ready, f"controller not ready after the group (exit {process.poll()})")

    def refused_frames(self, frames: list[str | bytes], codes: set[int], what: str,
                       headers: dict[str, str] | None = None) -> None:
        """An agent connection that sends ``frames`` is closed with one of ``codes``, and
        nothing in Redis changes."""
        before = self.dump()
        code, reason = exchange(self.ws + AGENT_WS_PATH, frames,
                                self.agent(HOSTILE_AGENT) if headers is None else headers)
        self.tally.check(code in codes and bool(reason), f"{what}: closed {code} {reason!r}")
        self.unchanged(before, what)

    def request(self, method: str, path: str, expected: set[int], what: str,
                **kwargs: Any) -> httpx.Response | None:
        """One REST call, refused as ``expected``; a refused one changes nothing."""
        before = self.dump()
        try:
            response = self.controller.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            self.tally.check(False, f"{what}: no answer ({exc!r})")
            return None
        self.tally.answer(response, expected, what)
        if response.status_code >= 400:
            self.unchanged(before, what)
        return response


def artifact_store(root: Path) -> Path:
    """Manifests and placeholder weights of two variants (nothing loads them)."""
    for family, variants in VARIANTS.items():
        for variant in variants:
            directory = root / family / variant
            directory.mkdir(parents=True)
            (directory / "weights.pt").write_bytes(b"w")
            (directory / "manifest.json").write_text(Manifest(
                family=family, variant=variant, profiled_size_mb=1.0, scale=0.1,
                weights_mb=0.1, weights_sha256="0" * 64, spec={"width": 8},
                max_batch_size=1).model_dump_json())
    return root


def exchange(url: str, frames: list[str | bytes],
              headers: dict[str, str]) -> tuple[int | None, str]:
    """Send ``frames`` on a new websocket; the close code and reason (None: refused at the
    handshake, the reason then being its HTTP status)."""
    try:
        with connect(url, additional_headers=headers, max_size=None, open_timeout=30) as ws:
            try:
                for frame in frames:
                    ws.send(frame)
                while True:
                    ws.recv(timeout=30)
            except ConnectionClosed as closed:
                return (closed.rcvd.code, closed.rcvd.reason) if closed.rcvd else (None, "")
            except TimeoutError:
                return None, "still open"
    except InvalidStatus as refused:
        return None, str(refused.response.status_code)


def hello(server_id: str = "h-1", capacity: str = CAPACITY, site: str = '"site-h"',
           **extra: str) -> str:
    """A hello as JSON text (``capacity``, ``site`` and ``extra`` values are JSON already)."""
    fields = "".join(f', "{k}": {v}' for k, v in extra.items())
    return (f'{{"v": 1, "type": "hello", "server_id": {json.dumps(server_id)}, '
            f'"site_id": {site}, "capacity": {capacity}{fields}}}')


def raw(bench: Bench, method: str, path: str) -> tuple[int, bytes]:
    """Send exactly ``path`` (no client normalises its dots or escapes, or refuses its length);
    status 0: the server closed the connection without an answer."""
    connection = http.client.HTTPConnection("127.0.0.1", bench.controller.port, timeout=30)
    try:
        connection.putrequest(method, path, skip_accept_encoding=True)
        connection.putheader("Authorization", bench.admin["Authorization"])
        connection.putheader("Content-Length", "0")
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.read()
    except (http.client.HTTPException, ConnectionError):
        return 0, b""
    finally:
        connection.close()


def all_apps(http: httpx.Client) -> list[dict[str, Any]]:
    """Every app's view, page by page."""
    found: list[dict[str, Any]] = []
    cursor = None
    while True:
        response = http.get("/v1/apps", params={"limit": 1000, **(
            {"cursor": cursor} if cursor else {})}, timeout=120)
        response.raise_for_status()
        found += response.json()
        link = response.headers.get("link", "")
        if 'rel="next"' not in link:
            return found
        cursor = httpx.URL(link.split(";")[0].strip("<>")).params.get("cursor")


def listed_apps(http: httpx.Client) -> int:
    return len(all_apps(http))


Placement = tuple[str, str | None, tuple[tuple[str, str, str], ...]]
"""An app's status, its serving server, and its replicas (server, variant, role)."""


def placements(http: httpx.Client) -> dict[str, Placement]:
    """Where every app is: its status, serving server and replicas."""
    return {app["app_id"]: (app["status"], (app["serving"] or {}).get("server_id"),
                            tuple(sorted((r["server_id"], r["variant"], r["role"])
                                         for r in app["replicas"])))
            for app in all_apps(http)}


def settled(http: httpx.Client, apps: int, timeout_s: float) -> dict[str, Placement]:
    """The placements once ``apps`` apps are all serving and stay unchanged for a second
    (or the last seen at ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    last: dict[str, Placement] = {}
    stable_since = time.monotonic()
    while time.monotonic() < deadline:
        now = placements(http)
        if now != last:
            last, stable_since = now, time.monotonic()
        elif (len(now) == apps and all(p[0] == "serving" for p in now.values())
              and time.monotonic() - stable_since >= 1.0):
            return now
        time.sleep(0.2)
    print(f"  (placements not settled in {timeout_s:.0f} s: "
          f"{Counter(p[0] for p in last.values())})", flush=True)
    return last


def servers(bench: Bench) -> dict[str, dict[str, Any]]:
    return {s["server_id"]: s for s in bench.controller.http.get("/v1/servers").json()}


def declared(bench: Bench, server_id: str, after: int) -> bool:
    """Whether the controller declared ``server_id`` failed since declaration ``after``."""
    found = bench.controller.http.get("/v1/declarations", params={"since": after}).json()
    return any(d["server_id"] == server_id for d in found)


def last_declaration(bench: Bench) -> int:
    found = bench.controller.http.get("/v1/declarations").json()
    return max((d["seq"] for d in found), default=0)


def wait(what: str, check: Any, timeout_s: float = 30.0, *, expected: bool = True) -> bool:
    """Whether ``check()`` came true within ``timeout_s`` (``expected``: say so if it did not;
    otherwise say so if it did)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            if not expected:
                print(f"  ({what} happened)", flush=True)
            return True
        time.sleep(0.05)
    if expected:
        print(f"  (timed out waiting for {what})", flush=True)
    return False
