"""A testbed's run directory: the state ``up`` persists, what a new run clears, credentials.

``<run_dir>/testbed.json`` records what ``up`` started, so that ``fail``, ``report`` and
``down`` work from another command (``deploy.testbed``).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent.repository import CACHE_DIR
from controller.credentials import CredentialStore
from deploy.processes import ProcessInfo, alive
from deploy.topology import Topology

STATE_FILE = "testbed.json"
CREDENTIALS_DIR = "credentials"
TLS_DIR = "tls"
CA_CERT = "ca.pem"


class TestbedError(RuntimeError):
    """A testbed step failed (a process did not start, the cluster did not converge)."""


@dataclass
class TestbedState:
    """What ``up`` started, persisted for the other commands."""

    run_dir: str
    controller_url: str
    redis_port: int
    artifacts: str
    processes: dict[str, ProcessInfo] = field(default_factory=dict)
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)
    apps: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    policy: str = "understudy"
    artifact_mirror: bool = True
    """Agents link verified weights from the local store instead of downloading them."""
    redis_password_file: str = ""
    """The Redis password (mode 0600, new at each ``up``); the controller reads it from there."""
    gateway_url: str = ""
    """The testbed's inference gateway (``understudy gateway``); empty when none runs."""
    tls: bool = False
    """The controller serves HTTPS/WSS with a certificate of the testbed's own CA."""

    @property
    def credentials(self) -> Path:
        """The controller's credential store, made by ``up`` (``controller.credentials``)."""
        return Path(self.run_dir) / CREDENTIALS_DIR

    @property
    def ca_file(self) -> Path | None:
        """The CA that signed the controller's certificate (None without TLS)."""
        return Path(self.run_dir) / TLS_DIR / CA_CERT if self.tls else None

    def save(self) -> None:
        """Write atomically to ``<run_dir>/testbed.json``."""
        path = Path(self.run_dir) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2), encoding="utf-8")
        os.replace(tmp, path)

    @classmethod
    def load(cls, run_dir: Path) -> TestbedState:
        """Read the state of a testbed started in ``run_dir``."""
        path = run_dir / STATE_FILE
        if not path.exists():
            raise TestbedError(f"no testbed in {run_dir} (run 'understudy testbed up' first)")
        data = json.loads(path.read_text(encoding="utf-8"))
        data["processes"] = {k: ProcessInfo(**v) for k, v in data["processes"].items()}
        data.pop("token", None)  # a testbed from before credentials (a fixed shared token)
        return cls(**data)


PREVIOUS_RUN_ENTRIES = ("appendonlydir", "dump.rdb", "ctl", "agents", "logs", "requests",
                        CREDENTIALS_DIR, TLS_DIR, "gateway", STATE_FILE)
"""What a testbed leaves in its run directory that a new one must not inherit (Redis would
reload the old apps from its append-only file). An artifact store there is kept."""


def clear_previous_run(run_dir: Path) -> None:
    """Remove a stopped testbed's state from ``run_dir``; refuse while one still runs there."""
    if (run_dir / STATE_FILE).exists():
        previous = TestbedState.load(run_dir)
        running = [name for name, info in previous.processes.items()
                   if alive(info.pid, info.started)]
        if running:
            raise TestbedError(f"a testbed still runs in {run_dir} ({', '.join(running)}); "
                               "run `understudy testbed down` first")
    for name in PREVIOUS_RUN_ENTRIES:
        path = run_dir / name
        if name == "agents" and path.is_dir():
            _clear_agents_keeping_caches(path)
        elif path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def _clear_agents_keeping_caches(agents: Path) -> None:
    """Remove the agents' run state but keep their verified artifact caches.

    Without them every agent downloads its weights again through the controller at once
    (2 GB for the demo set), which loads the controller and the agents while they register.
    """
    for agent_dir in agents.iterdir():
        if not agent_dir.is_dir():
            agent_dir.unlink()
            continue
        for entry in agent_dir.iterdir():
            if entry.name == CACHE_DIR:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def make_credentials(run_dir: Path, topology: Topology, tls: bool) -> None:
    """A credential per role and per server in ``run_dir/credentials``.

    With ``tls``, a CA and the controller's certificate in ``run_dir/tls``.
    """
    store = CredentialStore(run_dir / CREDENTIALS_DIR)
    store.init()
    for spec in topology.servers:
        store.issue_agent(spec.server_id)
    if tls:
        from controller.tls import make_ca_and_server_cert

        make_ca_and_server_cert(run_dir / TLS_DIR, ["127.0.0.1", "localhost"],
                                name="understudy testbed")
