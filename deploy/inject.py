"""Failure injection on a running testbed, each step recorded in its ``testbed.json``.

Three kinds (``deploy.declarations``): ``kill`` (SIGKILL of a server's process group: agent,
Triton, runtime), ``site`` (the same for every server of a site at one instant) and ``stop``
(SIGSTOP of a server's process group, SIGCONT later: the server is silent, not dead). Every
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

from deploy.declarations import KILL, SITE, STOP, Injection
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
    pgid = _group(bed, server_id)
    before = bed.serving_before([server_id])
    at = time.time()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGSTOP)
    bed.state.failures.append({"servers": [server_id], "at": at, "kind": STOP, "site": "",
                               "revived": {}, **before})
    bed.state.save()
    logger.info("stopped %s at %.3f", server_id, at)
    return at


def resume(bed: Testbed, server_id: str) -> float:
    """SIGCONT a stopped server's process group; returns (and records) the instant."""
    pgid = _group(bed, server_id)
    at = time.time()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGCONT)
    record = _open_failure(bed, server_id)
    if record is not None:
        record["resumed_at"] = at
        bed.state.save()
    return at


def revive(bed: Testbed, server_id: str, timeout_s: float = REVIVE_TIMEOUT_S) -> float:
    """Bring a failed server back and wait until the controller sees it up and connected.

    A killed server's agent is restarted; a stopped one is continued. The revival's completion
    is recorded (the end of the window in which a declaration of the server is true) and
    returned. On a timeout the restart instant stays recorded and TestbedError is raised.
    """
    record = _open_failure(bed, server_id)
    started = time.time()
    if record is not None and record.get("kind") == STOP:
        if "resumed_at" not in record:
            resume(bed, server_id)
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


def _up(bed: Testbed, server_id: str) -> bool:
    with contextlib.suppress(Exception):
        return any(s["server_id"] == server_id and s["state"] == "up" and s["connected"]
                   for s in bed.servers())
    return False


def _group(bed: Testbed, server_id: str) -> int:
    info = bed.state.processes.get(f"agent-{server_id}")
    if info is None:
        raise TestbedError(f"unknown server {server_id!r}")
    return info.pid


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
