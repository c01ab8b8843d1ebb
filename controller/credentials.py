"""The controller's credential store: who may call, as what role, for which server.

A directory (by default ``<run dir>/credentials``, mode 0700) holds:

* ``store.json`` (0600): the SHA-256 of every named credential with its role, and the secret
  agent credentials are derived from. Tokens themselves are never stored: a copy of the store
  lets no one in.
* ``<name>.token`` (0600): each named credential, written when it is made (``init``, ``issue``,
  ``rotate``) for the operator to hand out, e.g. ``admin.token``, ``read.token``.
* ``agents/<server id>/agent.token`` (0600): agent credentials issued here (``issue_agent``;
  a directory each, so that a deployment can hand each agent its own and nothing else).

An agent's credential is ``agent.<generation>.<server id>.<HMAC-SHA256(secret, generation.server
id)>``: the controller checks it by recomputing the MAC, so it need not store one per server,
and the credential names the only server its holder may speak for. Rotating one agent's
credential raises its generation (the store keeps that number); rotating the secret voids every
agent credential at once.

Tokens are compared in constant time (``hmac.compare_digest``). The store is re-read when its
file changes, so credentials issued or rotated by ``understudy credentials`` take effect in a
running controller without a restart.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import threading
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from understudy.wire.bounds import Id, check_name
from understudy.wire.secret_files import write_secret_file

logger = logging.getLogger(__name__)

STORE_FILE = "store.json"
AGENTS_DIR = "agents"
TOKEN_SUFFIX = ".token"
AGENT_TOKEN_FILE = "agent.token"
AGENT_PREFIX = "agent"
MAX_TOKEN_CHARS = 512
"""Longer bearer values are refused unread (no credential is this long)."""


class Role(StrEnum):
    """What a credential may do (``controller.access`` maps each route to the roles allowed)."""

    ADMIN = "admin"
    """The operator: everything."""
    READ = "read"
    """Every read: GET routes, the event stream, /metrics."""
    CLIENT = "client"
    """What an SDK client needs: resolve an app, follow its events, send graph requests."""
    GATEWAY = "gateway"
    """What the inference gateway needs: the app and server lists and the event stream."""
    AGENT = "agent"
    """One server's agent: its websocket (for that server only) and artifact downloads."""


DEFAULT_NAMES = (Role.ADMIN, Role.READ, Role.CLIENT, Role.GATEWAY)
"""The named credentials ``init`` makes, one per role but the agents', named after the role."""


@dataclass(frozen=True)
class Identity:
    """Who presented a credential."""

    role: Role
    name: str
    """The credential's name (``admin``, ``read`` ...; ``agent.<server id>`` for an agent)."""
    server_id: str | None = None
    """The server an agent credential speaks for (None for the other roles)."""


INSECURE = Identity(Role.ADMIN, "insecure")
"""Whoever calls a controller started with ``--insecure``."""


class CredentialError(RuntimeError):
    """The store is missing, unreadable, or a request of it cannot be met."""


class StoredCredential(BaseModel):
    """One named credential as the store keeps it: its hash, never the token."""

    model_config = ConfigDict(extra="forbid")

    name: Id
    role: Role
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class StoreFile(BaseModel):
    """``store.json``."""

    model_config = ConfigDict(extra="forbid")

    version: int = 1
    agent_secret: str = Field(pattern=r"^[0-9a-f]{64}$")
    agent_generations: dict[Id, int] = Field(default_factory=dict)
    """Servers whose agent credential was rotated: the current generation (absent: 0)."""
    credentials: list[StoredCredential] = Field(default_factory=list)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _new_token(role: Role) -> str:
    return f"{role.value}.{secrets.token_urlsafe(32)}"


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600), replacing it atomically.

    A directory made for it is its owner's only (0700).
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_secret_file(path, text)


class CredentialStore:
    """The credentials of one controller, kept in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._loaded: StoreFile | None = None
        self._loaded_stamp: tuple[int, int] | None = None

    @property
    def path(self) -> Path:
        """``store.json``."""
        return self.directory / STORE_FILE

    def exists(self) -> bool:
        """Whether the store was initialised."""
        return self.path.exists()

    def token_path(self, name: str) -> Path:
        """Where the named credential's token is written."""
        return self.directory / f"{check_name(name, 'credential name')}{TOKEN_SUFFIX}"

    def agent_token_path(self, server_id: str) -> Path:
        """Where an agent credential issued here is written."""
        return self.directory / AGENTS_DIR / check_name(server_id, "server id") / AGENT_TOKEN_FILE

    # --- making credentials ---------------------------------------------------------------------

    def init(self) -> list[Path]:
        """Create the store with one credential per role (not the agents'); the token files.

        Does nothing to a store that exists (returns no paths).
        """
        with self._lock:
            if self.exists():
                return []
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.directory, 0o700)
            data = StoreFile(agent_secret=secrets.token_hex(32))
            written = [self._add(data, role.value, role) for role in DEFAULT_NAMES]
            self._save(data)
        logger.info("credentials created in %s", self.directory)
        return written

    def issue(self, name: str, role: Role) -> Path:
        """A new named credential of ``role`` (replacing one of that name); its token file."""
        if role is Role.AGENT:
            raise CredentialError("agent credentials are issued per server (issue_agent)")
        with self._lock:
            data = self._read()
            path = self._add(data, name, role)
            self._save(data)
        logger.info("credential %s (%s) issued: %s", name, role.value, path)
        return path

    def rotate(self, name: str) -> Path:
        """A new token for the named credential (same role); the old one stops working."""
        data = self.load()
        found = next((c for c in data.credentials if c.name == name), None)
        if found is None:
            raise CredentialError(f"no credential named {name!r} in {self.directory}")
        return self.issue(name, found.role)

    def revoke(self, name: str) -> None:
        """Forget the named credential (its token stops working)."""
        with self._lock:
            data = self._read()
            kept = [c for c in data.credentials if c.name != name]
            if len(kept) == len(data.credentials):
                raise CredentialError(f"no credential named {name!r} in {self.directory}")
            data.credentials = kept
            self._save(data)
        self.token_path(name).unlink(missing_ok=True)

    def issue_agent(self, server_id: str, rotate: bool = False) -> Path:
        """Write the agent credential of ``server_id`` (``rotate``: a new one, voiding the old)."""
        check_name(server_id, "server id")
        with self._lock:
            data = self._read()
            if rotate:
                data.agent_generations[server_id] = data.agent_generations.get(server_id, 0) + 1
                self._save(data)
            token = self._agent_token(data, server_id)
        path = self.agent_token_path(server_id)
        write_private(path, token + "\n")
        logger.info("agent credential of %s%s: %s", server_id, " rotated" if rotate else "",
                    path)
        return path

    def agent_token(self, server_id: str) -> str:
        """The current agent credential of ``server_id`` (for tools that run beside the store)."""
        return self._agent_token(self.load(), check_name(server_id, "server id"))

    def rotate_agent_secret(self) -> None:
        """A new secret: every agent credential issued so far stops working."""
        with self._lock:
            data = self._read()
            data.agent_secret = secrets.token_hex(32)
            data.agent_generations = {}
            self._save(data)
        logger.warning("agent secret rotated in %s: every agent needs a new credential",
                       self.directory)

    def names(self) -> list[tuple[str, Role]]:
        """The named credentials and their roles."""
        return [(c.name, c.role) for c in self.load().credentials]

    # --- checking credentials -------------------------------------------------------------------

    def authenticate(self, token: str) -> Identity | None:
        """Who ``token`` belongs to; None when it is no credential of this store."""
        if not token or len(token) > MAX_TOKEN_CHARS:
            return None
        with self._lock:
            data = self._current()
        if token.startswith(AGENT_PREFIX + "."):
            return self._agent_identity(data, token)
        digest = _digest(token)
        found = None
        for credential in data.credentials:  # every entry compared: no early exit to time
            if hmac.compare_digest(digest, credential.sha256):
                found = credential
        return Identity(found.role, found.name) if found is not None else None

    def load(self) -> StoreFile:
        """The store as on disk now (re-read when the file changed)."""
        with self._lock:
            return self._read()

    # --- internals -----------------------------------------------------------------------------

    def _agent_identity(self, data: StoreFile, token: str) -> Identity | None:
        generation, _, rest = token[len(AGENT_PREFIX) + 1:].partition(".")
        server_id, _, mac = rest.rpartition(".")
        if not generation.isdigit() or not server_id or not mac:
            return None
        expected = _agent_mac(data.agent_secret, int(generation), server_id)
        if not hmac.compare_digest(mac.encode(), expected.encode()):
            return None
        if int(generation) != data.agent_generations.get(server_id, 0):
            return None  # rotated since
        return Identity(Role.AGENT, f"{AGENT_PREFIX}.{server_id}", server_id)

    def _agent_token(self, data: StoreFile, server_id: str) -> str:
        generation = data.agent_generations.get(server_id, 0)
        mac = _agent_mac(data.agent_secret, generation, server_id)
        return f"{AGENT_PREFIX}.{generation}.{server_id}.{mac}"

    def _add(self, data: StoreFile, name: str, role: Role) -> Path:
        token = _new_token(role)
        data.credentials = [c for c in data.credentials if c.name != name]
        data.credentials.append(StoredCredential(name=name, role=role, sha256=_digest(token)))
        path = self.token_path(name)
        write_private(path, token + "\n")
        return path

    def _read(self) -> StoreFile:
        """A copy of the store to change (and save)."""
        return self._current().model_copy(deep=True)

    def _current(self) -> StoreFile:
        """The store as loaded (shared: not to be changed)."""
        try:
            stat = self.path.stat()
        except FileNotFoundError as exc:
            raise CredentialError(f"no credential store in {self.directory} (run `understudy "
                                  f"credentials init --dir {self.directory}`)") from exc
        stamp = (stat.st_mtime_ns, stat.st_ino)
        if self._loaded is None or stamp != self._loaded_stamp:
            try:
                self._loaded = StoreFile.model_validate_json(self.path.read_bytes())
            except (OSError, ValueError) as exc:
                raise CredentialError(f"credential store {self.path} unreadable: {exc}") from exc
            self._loaded_stamp = stamp
            if stat.st_mode & 0o077:
                logger.warning("credential store %s is readable by others (mode %o): "
                               "chmod 600 it", self.path, stat.st_mode & 0o777)
        return self._loaded

    def _save(self, data: StoreFile) -> None:
        write_private(self.path, json.dumps(data.model_dump(mode="json"), indent=2) + "\n")
        self._loaded = None


def _agent_mac(secret: str, generation: int, server_id: str) -> str:
    message = f"{generation}.{server_id}".encode()
    return hmac.new(bytes.fromhex(secret), message, hashlib.sha256).hexdigest()
