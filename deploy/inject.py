"""Failure injection on a running testbed, each step recorded in its ``testbed.json``.

Five kinds (``deploy.declarations``): ``kill`` (SIGKILL of a server's process group: agent,
Triton, runtime), ``site`` (the same for every server of a site at one instant), ``stop``
(SIGSTOP of a server's process group, SIGCONT later: the server is silent, not dead),
``triton`` (SIGKILL of the server's ``tritonserver`` process alone: its agent reports the death
and restarts it) and ``agent`` (SIGKILL of the agent process alone: what it started dies with
it or is left over, and its revival starts a new agent beside what is left). Every
injection is a record in the testbed's ``failures`` list: ``servers``, ``at`` (wall time, taken
just before the signal), ``kind``, ``site``, ``revived`` (server -> wall time its revival
completed: the controller sees it up and connected again) and ``serving_before`` (the apps
served from the servers just before, from ``GET /v1/apps``). Reports judge every failure
declaration of the controller (:func:`fetch_declarations`) against these records.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from typing import Any

from deploy.declarations import AGENT, KILL, SITE, STOP, TRITON, Injection
from deploy.processes import ProcessInfo, signal_group, signal_process, start_ticks
from deploy.testbed import Testbed, TestbedError, wait_until

logger = logging.getLogger(__name__)

REVIVE_TIMEOUT_S = 180.0


def kill(bed: Testbed, servers: list[str], site: str = "") -> float:
    """SIGKILL the servers' process groups (a site's, when ``site``); returns the instant."""
    at = bed.fail(servers)
    _annotate(bed, at, kind=SITE if site else KILL, site=site)
    return at


def pause(bed: Testbed, server_id: str) -> float:
    """SIGSTOP one server's process group; returns (and records) the instant."""
    group = _agent(bed, server_id)
    before = bed.serving_before([server_id])
    at = time.time()
    signal_group(group, signal.SIGSTOP)
    bed.state.failures.append({"servers": [server_id], "at": at, "kind": STOP, "site": "",
                               "revived": {}, **before})
    bed.state.save()
    logger.info("stopped %s at %.3f", server_id, at)
    return at


def kill_triton(bed: Testbed, server_id: str) -> float:
    """SIGKILL the server's ``tritonserver`` alone; returns (and records) the instant.

    The record keeps the killed ``pid``. TestbedError when the agent runs no Triton now.
    """
    pid = triton_pid(bed, server_id)
    started = start_ticks(pid) if pid is not None else None
    if pid is None or started is None:
        raise TestbedError(f"{server_id}'s agent runs no tritonserver now")
    return _signal_one(bed, server_id, pid, started, TRITON)


def kill_agent(bed: Testbed, server_id: str) -> float:
    """SIGKILL the server's agent process alone; returns (and records) the instant.

    The record keeps the agent's ``pid`` (its process group: see :func:`group_members`).
    """
    agent = _agent(bed, server_id)
    return _signal_one(bed, server_id, agent.pid, agent.started, AGENT)


def triton_pid(bed: Testbed, server_id: str) -> int | None:
    """The pid of the ``tritonserver`` the server's agent runs now, if any."""
    agent = _group(bed, server_id)
    found = [pid for pid, parent, name in _processes() if parent == agent
             and name == "tritonserver"]
    return found[0] if found else None


def group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, command name) of the live processes in process group ``pgid``."""
    return [(pid, name) for pid, _, name in _processes(pgid)]


def _processes(pgid: int | None = None) -> list[tuple[int, int, str]]:
    """(pid, parent pid, command name) of every live process (of group ``pgid`` if given)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as stat:
                text = stat.read()
        except OSError:
            continue
        name = text[text.find("(") + 1:text.rfind(")")]
        fields = text[text.rfind(")") + 2:].split()
        if fields[0] in ("Z", "X") or (pgid is not None and int(fields[2]) != pgid):
            continue
        found.append((int(entry), int(fields[1]), name))
    return found


def _signal_one(bed: Testbed, server_id: str, pid: int, started: int | None,
                kind: str) -> float:
    before = bed.serving_before([server_id])
    at = time.time()
    signal_process(pid, started, signal.SIGKILL, f"{server_id}'s {kind}")
    bed.state.failures.append({"servers": [server_id], "at": at, "kind": kind, "site": "",
                               "revived": {}, "pid": pid, **before})
    bed.state.save()
    logger.info("killed %s's %s (pid %d) at %.3f", server_id, kind, pid, at)
    return at


def resume(bed: Testbed, server_id: str) -> float:
    """SIGCONT a stopped server's process group; returns (and records) the instant."""
    group = _agent(bed, server_id)
    at = time.time()
    signal_group(group, signal.SIGCONT)
    record = _open_failure(bed, server_id)
    if record is not None:
        record["resumed_at"] = at
        bed.state.save()
    return at


def revive(bed: Testbed, server_id: str, timeout_s: float = REVIVE_TIMEOUT_S) -> float:
    """Bring a failed server back and wait until the controller sees it up and connected.

    A killed server's agent is restarted; a stopped one is continued; a server whose Triton was
    killed is waited for (its agent restarts Triton) until the controller has declared it
    failed and sees it back. The revival's completion is recorded (the end of the window in
    which a declaration of the server is true) and returned. On a timeout the restart instant
    stays recorded and TestbedError is raised.
    """
    record = _open_failure(bed, server_id)
    started = time.time()
    kind = record.get("kind") if record is not None else None
    if record is not None and kind == STOP:
        if "resumed_at" not in record:
            resume(bed, server_id)
    elif record is not None and kind == TRITON:
        _wait_declared(bed, server_id, record["at"], timeout_s)
    else:
        bed.start_agent(server_id)
    if record is not None:
        record.setdefault("revived", {})[server_id] = started
        bed.state.save()
    wait_until(f"{server_id} up and connected", lambda: _up(bed, server_id), timeout_s, 0.1)
    done = time.time()
    if record is not None:
        record["revived"][server_id] = done
        bed.state.save()
    return done


def injections(state: Any) -> list[Injection]:
    """The injections recorded in a testbed's state, in order."""
    return [Injection.from_record(record) for record in state.failures]


def fetch_declarations(http: Any, page: int = 1000) -> list[dict[str, Any]]:
    """Every failure declaration the controller logged (``GET /v1/declarations``, paged)."""
    found: list[dict[str, Any]] = []
    while True:
        since = found[-1]["seq"] if found else 0
        response = http.get("/v1/declarations", params={"since": since, "limit": page})
        response.raise_for_status()
        batch = response.json()
        if not batch:
            return found
        found += batch


def _wait_declared(bed: Testbed, server_id: str, since: float, timeout_s: float) -> None:
    """Wait until the controller declared ``server_id`` failed at or after ``since``.

    A declaration that never comes (the Triton came back before anything noticed) is logged
    and the revival goes on.
    """
    def declared() -> bool:
        with contextlib.suppress(Exception):
            return any(d["server_id"] == server_id and d["detected_at"] >= since
                       for d in fetch_declarations(bed.http))
        return False

    try:
        wait_until(f"a declaration of {server_id}", declared, min(timeout_s, 30.0), 0.1)
    except TestbedError as exc:
        logger.warning("%s", exc)


def _up(bed: Testbed, server_id: str) -> bool:
    with contextlib.suppress(Exception):
        return any(s["server_id"] == server_id and s["state"] == "up" and s["connected"]
                   for s in bed.servers())
    return False


def _group(bed: Testbed, server_id: str) -> int:
    return _agent(bed, server_id).pid


def _agent(bed: Testbed, server_id: str) -> ProcessInfo:
    info = bed.state.processes.get(f"agent-{server_id}")
    if info is None:
        raise TestbedError(f"unknown server {server_id!r}")
    return info


def _open_failure(bed: Testbed, server_id: str) -> dict[str, Any] | None:
    """The server's latest recorded failure whose revival has not been recorded."""
    for record in reversed(bed.state.failures):
        if server_id in record["servers"]:
            return record if server_id not in record.get("revived", {}) else None
    return None


def _annotate(bed: Testbed, at: float, **fields: Any) -> None:
    """Add fields to the failure record ``Testbed.fail`` just wrote at ``at``."""
    for record in reversed(bed.state.failures):
        if record["at"] == at:
            record.update(fields)
            record.setdefault("revived", {})
            bed.state.save()
            return
