"""The only module that talks to agents: one websocket each, commands with futures by id.

``serve`` runs for the life of one agent connection: it waits for the ``hello``, gives the agent
its heartbeat channel (heartbeats go to the detector's monitor process as UDP datagrams, never
through this loop), hands the hello to the orchestrator, then routes results to the waiting
command and Triton death reports to the detector. ``command`` sends one command and awaits its
result.

A connect storm (a thousand agents after a controller restart or a network partition heals) is
admitted :data:`HELLO_CONCURRENCY` hellos at a time; an agent that waits longer than
:data:`ADMISSION_WAIT_S` is told to come back later (close code 1013) and retries after a
jittered back-off.

Every frame is validated before anything acts on it (``understudy.wire.protocol``: bounded ids,
finite numbers, bounded lists and frame size). A frame that breaks the rules closes its
connection with a reason (close code 1009 for a frame too large, 1008 otherwise), so nothing it
says reaches Redis; only a frame of a type this controller does not know is skipped (a newer
agent's message).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from controller.detector import FailureDetector
from controller.errors import AgentCommandError, AgentUnavailableError
from model_repo.artifacts import Manifest
from understudy.wire.protocol import (
    CommandResult,
    Configure,
    FrameTooLargeError,
    Hello,
    InventoryCommand,
    InventoryItem,
    LoadCommand,
    PrefetchCommand,
    ProtocolError,
    ReplicaExited,
    TritonDown,
    TritonUp,
    UnknownMessageError,
    UnloadCommand,
    encode,
    parse_agent_message,
)

logger = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0
HELLO_CONCURRENCY = 32
"""Hellos handled at once (each one reads and writes Redis and may re-plan)."""
ADMISSION_WAIT_S = 15.0
TRY_AGAIN_LATER = 1013
POLICY_VIOLATION = 1008
"""Close code for a frame that breaks the protocol (RFC 6455)."""
MESSAGE_TOO_BIG = 1009
MAX_CLOSE_REASON_BYTES = 123
"""The most a websocket close frame's reason may hold (RFC 6455, 5.5)."""


class AgentHub:
    """Connected agents by server id."""

    def __init__(self, detector: FailureDetector,
                 on_hello: Callable[[Hello], Awaitable[None]],
                 on_triton_up: Callable[[str, TritonUp], Awaitable[None]],
                 on_revived: Callable[[str], Awaitable[None]]) -> None:
        self.detector = detector
        self.on_hello = on_hello
        self.on_triton_up = on_triton_up
        self.on_revived = on_revived
        self._sockets: dict[str, Any] = {}
        self._pending: dict[str, tuple[str, asyncio.Future[CommandResult]]] = {}
        """Command id -> (the server it was sent to, the future of its result)."""
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._admission = asyncio.Semaphore(HELLO_CONCURRENCY)
        self.refused_hellos = 0
        detector.alive_listeners.append(self._on_alive)
        self.on_replica_exited: Callable[[str, ReplicaExited], None] | None = None
        """Set by the graph manager: a service-graph replica process on a server ended."""

    def connected(self, server_id: str) -> bool:
        """Whether the server's agent is connected now."""
        return server_id in self._sockets

    async def serve(self, websocket: Any, credential_server: str | None = None) -> None:
        """Handle one agent connection until it closes (FastAPI websocket).

        ``credential_server``: the server the connection's credential speaks for; a hello for
        another server is refused (None: any, when authentication is off).
        """
        hello = await self._hello(websocket)
        if hello is None:
            return
        if credential_server is not None and hello.server_id != credential_server:
            logger.warning("agent connection refused: its credential is %s's, its hello "
                           "claims server %s", credential_server, hello.server_id)
            await _refuse(websocket, POLICY_VIOLATION,
                          f"this credential speaks for server {credential_server}, "
                          f"not {hello.server_id}")
            return
        try:
            await asyncio.wait_for(self._admission.acquire(), ADMISSION_WAIT_S)
        except TimeoutError:
            self.refused_hellos += 1
            await websocket.close(code=TRY_AGAIN_LATER, reason="controller busy; retry later")
            return
        server_id = hello.server_id
        previous = self._sockets.get(server_id)
        if previous is not None:
            logger.warning("server %s connected again (%s); dropping the older connection",
                           server_id, "with its own credential" if credential_server
                           else "authentication off")
            await _close_quietly(previous)
        self._sockets[server_id] = websocket
        try:
            try:  # the admission slot is held for the hello only, not the connection
                channel = self.detector.admit(
                    server_id, hello.endpoints.http if hello.endpoints else None)
                await websocket.send_text(encode(channel))
                await self.on_hello(hello)
            finally:
                self._admission.release()
            await self._receive(server_id, websocket)
        finally:
            # Make sure the agent sees the end too (it then reconnects with a fresh hello).
            await _close_quietly(websocket)
            if self._sockets.get(server_id) is websocket:
                del self._sockets[server_id]
                self.fail_pending(server_id, "its connection closed")
                self.detector.connection_closed(server_id)

    async def _hello(self, websocket: Any) -> Hello | None:
        """The connection's valid hello, or None once the connection is closed with a reason."""
        from starlette.websockets import WebSocketDisconnect

        try:
            raw = await asyncio.wait_for(_receive_frame(websocket), HELLO_TIMEOUT_S)
            hello = parse_agent_message(raw)
        except TimeoutError:
            await _refuse(websocket, POLICY_VIOLATION,
                          f"expected a hello frame within {HELLO_TIMEOUT_S:g} s")
            return None
        except WebSocketDisconnect:
            return None
        except ProtocolError as exc:
            logger.warning("agent connection refused: %s", exc)
            await _refuse(websocket, _close_code(exc), f"bad hello: {exc}")
            return None
        if not isinstance(hello, Hello):
            await _refuse(websocket, POLICY_VIOLATION,
                          f"expected a hello frame, got {hello.type!r}")
            return None
        return hello

    def _on_alive(self, server_id: str) -> None:
        """A declared server's heartbeats say it is alive again: it returns.

        Like a restarted server, but without a new hello (e.g. after a stop of the whole box).
        """
        if server_id in self._sockets:
            self.detector.watch(server_id)
            self._spawn(self.on_revived(server_id))

    async def _receive(self, server_id: str, websocket: Any) -> None:
        from starlette.websockets import WebSocketDisconnect

        while True:
            try:
                raw = await _receive_frame(websocket)
            except WebSocketDisconnect as exc:
                logger.info("agent %s disconnected (code %s)", server_id, exc.code)
                return
            except (RuntimeError, KeyError) as exc:
                logger.warning("agent %s connection broken: %r", server_id, exc)
                return
            try:
                message = parse_agent_message(raw)
            except UnknownMessageError as exc:
                logger.warning("frame from %s skipped: %s", server_id, exc)
                continue
            except ProtocolError as exc:
                await self._bad_frame(server_id, websocket, exc)
                return
            self._route(server_id, message, websocket)

    def _route(self, server_id: str, message: Any, websocket: Any = None) -> None:
        """Hand one valid frame to whoever waits for it.

        A frame speaks for the connection's own server only; and once a newer connection of
        that server replaced this one, only its command results still count (for commands
        this connection was sent): what it says of Triton or replicas is stale.
        """
        if websocket is not None and self._sockets.get(server_id) is not websocket and \
                not isinstance(message, CommandResult):
            logger.warning("%s frame from a replaced connection of %s ignored",
                           getattr(message, "type", "?"), server_id)
            return
        if isinstance(message, CommandResult):
            pending = self._pending.get(message.command_id)
            if pending is None:
                return  # a command that timed out meanwhile
            sent_to, future = pending
            if sent_to != server_id:
                logger.warning("server %s answered command %s, which was sent to %s; ignored",
                               server_id, message.command_id, sent_to)
                return
            del self._pending[message.command_id]
            if not future.done():
                future.set_result(message)
        elif isinstance(message, TritonDown):
            self.detector.declare(server_id, "triton died")
        elif isinstance(message, TritonUp):
            self._spawn(self.on_triton_up(server_id, message))
        elif isinstance(message, ReplicaExited) and self.on_replica_exited is not None:
            self.on_replica_exited(server_id, message)

    async def _bad_frame(self, server_id: str, websocket: Any, error: ProtocolError) -> None:
        """Close the connection of an agent that sent an invalid frame, saying why.

        The command it meant to answer (when the frame names one of this server's) fails now
        instead of waiting for its time-out.
        """
        logger.warning("bad frame from %s; closing its connection: %s", server_id, error)
        pending = self._pending.get(error.command_id or "")
        if pending is not None and pending[0] == server_id:
            del self._pending[error.command_id or ""]
            if not pending[1].done():
                pending[1].set_exception(AgentCommandError(
                    f"{server_id}: invalid result frame: {error}", code="bad_frame"))
        await _refuse(websocket, _close_code(error), f"bad frame: {error}")

    def fail_pending(self, server_id: str, why: str) -> int:
        """Fail now every command sent to the server and not answered; returns how many.

        Called when its connection closes and when it is declared failed: no answer is coming
        (or none that counts), and a failover's loads wait behind the unloads it sent there.
        Their callers treat it as an agent out of reach: the reconciler or the server's
        return sends what is still wanted again.
        """
        failed = 0
        for command_id, (sent_to, future) in list(self._pending.items()):
            if sent_to != server_id:
                continue
            del self._pending[command_id]
            if not future.done():
                future.set_exception(AgentUnavailableError(
                    f"agent of {server_id}: no answer coming ({why})"))
                failed += 1
        if failed:
            logger.warning("%d command(s) sent to %s failed: %s", failed, server_id, why)
        return failed

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def send(self, server_id: str, command: LoadCommand | UnloadCommand |
                   InventoryCommand | PrefetchCommand) -> asyncio.Future[CommandResult]:
        """Send a command now; the returned future gets its result.

        The agent runs the commands of one model in the order they arrive, so a caller that
        must order an unload before a later load sends it while holding its own lock.
        """
        websocket = self._sockets.get(server_id)
        if websocket is None:
            raise AgentUnavailableError(f"agent of server {server_id} is not connected")
        future: asyncio.Future[CommandResult] = asyncio.get_running_loop().create_future()
        self._pending[command.command_id] = (server_id, future)
        try:
            await websocket.send_text(encode(command))
        except Exception as exc:  # noqa: BLE001 - a send on a dead socket
            self._pending.pop(command.command_id, None)
            raise AgentUnavailableError(f"agent of {server_id}: {exc}") from exc
        return future

    async def command(self, server_id: str, command: LoadCommand | UnloadCommand |
                      InventoryCommand | PrefetchCommand, timeout_s: float = 300.0,
                      sent: asyncio.Future[CommandResult] | None = None) -> CommandResult:
        """Send a command (unless ``sent`` is its future) and wait for its result."""
        future = sent if sent is not None else await self.send(server_id, command)
        try:
            result = await asyncio.wait_for(future, timeout_s)
        except TimeoutError as exc:
            raise AgentUnavailableError(
                f"agent of {server_id} did not answer {command.type} in {timeout_s} s") from exc
        finally:
            self._pending.pop(command.command_id, None)
        if not result.ok:
            error = result.error
            raise AgentCommandError(
                f"{server_id}: {command.type} failed: {error.message if error else 'unknown'}",
                code=error.code if error else "", retryable=error.retryable if error else False)
        return result

    def next_id(self) -> str:
        """A fresh command id."""
        return f"cmd-{next(self._ids)}"

    async def load(self, server_id: str, app_id: str, variant: str, urgent: bool = False,
                   manifest: Manifest | None = None) -> CommandResult:
        """Load ``<app>__<variant>`` on a server (``urgent``: ahead of routine loads).

        With the variant's ``manifest`` an agent holding verified weights asks nothing back.
        """
        return await self.command(server_id, LoadCommand(command_id=self.next_id(),
                                                         app_id=app_id, variant=variant,
                                                         urgent=urgent, manifest=manifest))

    async def prefetch(self, server_id: str, variant: str,
                       manifest: Manifest | None = None) -> CommandResult:
        """Have a server cache a variant's weights (no load)."""
        return await self.command(server_id, PrefetchCommand(command_id=self.next_id(),
                                                             variant=variant,
                                                             manifest=manifest))

    async def unload(self, server_id: str, app_id: str, variant: str) -> CommandResult:
        """Unload ``<app>__<variant>`` from a server."""
        return await self.command(server_id, UnloadCommand(command_id=self.next_id(),
                                                           app_id=app_id, variant=variant))

    async def start_unload(self, server_id: str, app_id: str,
                           variant: str) -> Awaitable[CommandResult]:
        """Send an unload now; its result comes from the returned awaitable.

        The caller may hold a lock that orders this unload before a later load of the model.
        """
        command = UnloadCommand(command_id=self.next_id(), app_id=app_id, variant=variant)
        sent = await self.send(server_id, command)
        return self.command(server_id, command, sent=sent)

    async def inventory(self, server_id: str) -> list[InventoryItem]:
        """What the server's Triton holds now."""
        result = await self.command(server_id, InventoryCommand(command_id=self.next_id()),
                                    timeout_s=30.0)
        return list(result.inventory or [])

    async def configure(self, heartbeat_interval_ms: float) -> None:
        """Push a new heartbeat interval to every connected agent."""
        text = encode(Configure(heartbeat_interval_ms=heartbeat_interval_ms))
        for websocket in list(self._sockets.values()):
            try:
                await websocket.send_text(text)
            except Exception:  # noqa: BLE001, S112 - a closing socket; its agent re-hellos
                continue

    async def close_all(self) -> None:
        """Close every agent connection (shutdown)."""
        for websocket in list(self._sockets.values()):
            await _close_quietly(websocket)
        self._sockets.clear()


async def _receive_frame(websocket: Any) -> str | bytes:
    """The next frame's payload, text or binary (WebSocketDisconnect when the peer left)."""
    from starlette.websockets import WebSocketDisconnect

    message = await websocket.receive()
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000), message.get("reason"))
    text = message.get("text")
    return text if text is not None else message.get("bytes") or b""


def _close_code(error: ProtocolError) -> int:
    return MESSAGE_TOO_BIG if isinstance(error, FrameTooLargeError) else POLICY_VIOLATION


def close_reason(text: str) -> str:
    """``text`` cut to what a close frame may carry (whole UTF-8 characters)."""
    return text.encode()[:MAX_CLOSE_REASON_BYTES].decode("utf-8", "ignore")


async def _refuse(websocket: Any, code: int, reason: str) -> None:
    try:
        await websocket.close(code=code, reason=close_reason(reason))
    except Exception:  # noqa: BLE001 - the peer is gone already
        return


async def _close_quietly(websocket: Any) -> None:
    try:
        await websocket.close(code=1001, reason="controller shutting down or replaced")
    except Exception:  # noqa: BLE001 - already closed
        return
