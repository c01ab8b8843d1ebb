"""Who may call what: the one table of routes and the roles allowed, and the gate that checks it.

Every REST route and websocket of the controller has a row in :data:`ACCESS`; the HTTP layer
(``controller.http_guard``) asks :class:`Gate` and nothing else, before a body is read or a
websocket accepted. ``create_app`` refuses to build an application with a route the table does
not name (:func:`uncovered`), so a new route cannot be open by omission.

Answers: no credential, or one the store does not know: 401; a known credential whose role the
row does not list: 403. A route open to everyone (health, the schema) needs no credential. A
controller started with ``--insecure`` has no store: every caller is :data:`INSECURE` (admin).
"""

from __future__ import annotations

import hmac
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller.credentials import INSECURE, CredentialError, CredentialStore, Identity, Role

logger = logging.getLogger(__name__)

WEBSOCKET = "WS"
"""The "method" of a websocket route in the table."""
OPEN: frozenset[Role] = frozenset()
"""No credential needed."""

ADMIN = frozenset({Role.ADMIN})
READERS = frozenset({Role.ADMIN, Role.READ})
SNAPSHOT = READERS | {Role.GATEWAY}
"""The lists the gateway loads its routing table from."""
RESOLVE = SNAPSHOT | {Role.CLIENT, Role.AGENT}
"""Where one app is served, and its events: what an SDK client needs. Agents too: the service
graph replicas on a server resolve apps with the SDK under their agent's credential."""
AGENTS = frozenset({Role.AGENT})
ARTIFACTS = frozenset({Role.ADMIN, Role.AGENT})
GRAPH_REQUEST = frozenset({Role.ADMIN, Role.CLIENT})

ACCESS: dict[tuple[str, str], frozenset[Role]] = {
    ("GET", "/healthz"): OPEN,
    ("GET", "/readyz"): OPEN,
    ("GET", "/openapi.json"): OPEN,
    ("GET", "/docs"): OPEN,
    ("GET", "/docs/oauth2-redirect"): OPEN,
    ("GET", "/redoc"): OPEN,
    ("GET", "/metrics"): READERS,
    ("POST", "/v1/apps"): ADMIN,
    ("POST", "/v1/apps/batch"): ADMIN,
    ("GET", "/v1/apps"): SNAPSHOT,
    ("GET", "/v1/apps/{app_id}"): RESOLVE,
    ("DELETE", "/v1/apps/{app_id}"): ADMIN,
    ("GET", "/v1/servers"): SNAPSHOT,
    ("GET", "/v1/servers/{server_id}"): SNAPSHOT,
    ("POST", "/v1/servers/{server_id}/drain"): ADMIN,
    ("GET", "/v1/config"): READERS,
    ("PATCH", "/v1/config"): ADMIN,
    ("GET", "/v1/plan"): READERS,
    ("POST", "/v1/plan/solve"): ADMIN,
    ("GET", "/v1/events"): READERS,
    (WEBSOCKET, "/v1/events/ws"): RESOLVE,
    ("GET", "/v1/declarations"): READERS,
    (WEBSOCKET, "/v1/agents/connect"): AGENTS,
    ("GET", "/v1/artifacts/{variant}/{name}"): ARTIFACTS,
    ("POST", "/v1/graphs"): ADMIN,
    ("GET", "/v1/graphs"): READERS,
    ("GET", "/v1/graphs/{name}"): READERS,
    ("DELETE", "/v1/graphs/{name}"): ADMIN,
    ("POST", "/v1/graphs/{name}/requests"): GRAPH_REQUEST,
    ("GET", "/v1/graphs/{name}/consistency"): READERS,
}
"""(method, path template) -> the roles allowed (admin is in every non-open row)."""


def _pattern(template: str) -> re.Pattern[str]:
    parts = re.split(r"(\{[^}]+\})", template)
    return re.compile("^" + "".join("[^/]+" if p.startswith("{") else re.escape(p)
                                    for p in parts) + "$")


_COMPILED = [(method, _pattern(template), roles) for (method, template), roles in ACCESS.items()]


def roles_for(method: str, path: str) -> frozenset[Role] | None:
    """The roles allowed to call ``method path``; None when the table has no such route."""
    method = "GET" if method == "HEAD" else method
    for row_method, pattern, roles in _COMPILED:
        if row_method == method and pattern.match(path):
            return roles
    return None


def uncovered(routes: Iterable[Any]) -> list[str]:
    """The application's routes the table does not name (``METHOD path`` each)."""
    missing = []
    for route in routes:
        path = getattr(route, "path", None)
        methods = getattr(route, "methods", None)
        if path is None:
            continue
        for method in sorted(methods) if methods else [WEBSOCKET]:
            if method != "HEAD" and (method, path) not in ACCESS:
                missing.append(f"{method} {path}")
    return missing


@dataclass(frozen=True)
class Decision:
    """The gate's answer: 0 to let the call in (with who it is), else 401 or 403 and why."""

    status: int
    detail: str = ""
    identity: Identity | None = None

    @property
    def allowed(self) -> bool:
        """Whether the call may go on."""
        return self.status == 0


class Gate:
    """Checks each call against :data:`ACCESS` with the credentials of ``store``.

    ``store`` None: authentication is off (``--insecure``), every caller is admin.
    """

    def __init__(self, store: CredentialStore | None,
                 tokens: Mapping[str, Identity] | None = None) -> None:
        self.store = store
        self._tokens = dict(tokens or {})
        self._last_error = ""

    @classmethod
    def with_tokens(cls, tokens: Mapping[str, Role]) -> Gate:
        """A gate that knows only ``tokens`` (token -> role): for tests of the HTTP layer."""
        return cls(None, {token: Identity(role, role.value) for token, role in tokens.items()})

    @property
    def insecure(self) -> bool:
        """Whether authentication is off."""
        return self.store is None and not self._tokens

    def check(self, method: str, path: str, authorization: str | None) -> Decision:
        """May the caller with this ``Authorization`` header call ``method path``?"""
        if self.insecure:
            return Decision(0, identity=INSECURE)
        roles = roles_for(method, path)
        if roles is None or roles == OPEN:
            # No such route (the application answers 404 or 405) or an open one.
            return Decision(0)
        identity = self.authenticate(authorization)
        if identity is None:
            return Decision(401, "missing or unknown credential")
        if identity.role not in roles:
            return Decision(403, f"the {identity.role.value} credential {identity.name!r} may "
                                 f"not call {method} {path[:200]}")
        return Decision(0, identity=identity)

    def authenticate(self, authorization: str | None) -> Identity | None:
        """Who the bearer credential in an ``Authorization`` header is; None if no one."""
        scheme, _, value = (authorization or "").partition(" ")
        token = value.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        if self._tokens:
            found = None
            for known, identity in self._tokens.items():
                if hmac.compare_digest(known.encode(), token.encode()):
                    found = identity
            return found
        if self.store is None:
            return None
        try:
            return self.store.authenticate(token)
        except CredentialError as exc:
            # No store (not initialised yet, removed, corrupt): no one gets in.
            if str(exc) != self._last_error:
                self._last_error = str(exc)
                logger.error("every credential refused: %s", exc)
            return None
