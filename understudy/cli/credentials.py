"""``understudy credentials init|agent|issue|rotate|rotate-agents|revoke|list|tls``.

Manages a controller's credential store (``controller.credentials``) and makes a private CA and
the controller's TLS certificate (``controller.tls``). Commands print the paths they write,
never a token. A running controller sees changes at its next request (no restart). See
docs/security.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_DIR = Path("runs/controller/credentials")
"""Where ``understudy controller`` keeps its store by default (its run directory's)."""


def register(parser: argparse.ArgumentParser) -> None:
    """Add the ``credentials`` actions to its command parser."""
    actions = parser.add_subparsers(dest="credentials_command", required=True, metavar="ACTION")
    init = actions.add_parser("init", help="create the store with a credential per role "
                              "(admin, read, client, gateway); does nothing to one that exists")
    init.add_argument("--agent", action="append", default=[], metavar="SERVER_ID",
                      help="also issue this server's agent credential (repeatable)")
    init.add_argument("--owner", default=None, metavar="UID[:GID]",
                      help="hand the store and every file written to this owner (as root, "
                      "e.g. a container job writing for another user)")
    agent = actions.add_parser("agent", help="write a server's agent credential "
                               "(DIR/agents/SERVER_ID/agent.token)")
    agent.add_argument("--server-id", required=True)
    agent.add_argument("--rotate", action="store_true",
                       help="a new credential: the server's old one stops working")
    issue = actions.add_parser("issue", help="a new named credential of a role")
    issue.add_argument("--name", required=True, help="e.g. grafana (written to DIR/NAME.token)")
    issue.add_argument("--role", required=True, choices=["admin", "read", "client", "gateway"])
    rotate = actions.add_parser("rotate", help="a new token for a named credential; the old one "
                                "stops working")
    rotate.add_argument("name", help="admin, read, client, gateway or an issued name")
    actions.add_parser("rotate-agents", help="a new agent secret: every agent credential stops "
                       "working (issue each again with 'agent')")
    revoke = actions.add_parser("revoke", help="forget a named credential")
    revoke.add_argument("name")
    actions.add_parser("list", help="the named credentials and their roles")
    for sub in (init, agent, issue, rotate, actions.choices["rotate-agents"], revoke,
                actions.choices["list"]):
        sub.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                         help=f"the credential store (default {DEFAULT_DIR}, the controller's "
                         "default)")
    tls = actions.add_parser("tls", help="a private CA (reused when there) and a server "
                             "certificate for the controller")
    tls.add_argument("--out", type=Path, required=True,
                     help="directory for ca.pem, ca.key, server.pem, server.key")
    tls.add_argument("--host", action="append", required=True, metavar="NAME_OR_IP",
                     help="a name or address agents and clients reach the controller at "
                     "(repeatable)")


def run(options: argparse.Namespace) -> int:
    """Carry out one action."""
    from controller.credentials import CredentialError

    try:
        return _ACTIONS[options.credentials_command](options)
    except (CredentialError, ValueError, OSError) as exc:
        logger.error("%s", exc)
        return 1


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")


def _init(options: argparse.Namespace) -> int:
    from controller.credentials import CredentialStore

    store = CredentialStore(options.dir)
    written = store.init()
    if not written:
        _say(f"store exists in {options.dir}; nothing changed")
    for path in written:
        _say(f"wrote {path}")
    for server_id in options.agent:
        _say(f"wrote {store.issue_agent(server_id)}")
    if options.owner is not None:
        _chown(options.dir, options.owner)
    return 0


def _chown(directory: Path, owner: str) -> None:
    uid, _, gid = owner.partition(":")
    user, group = int(uid), int(gid or uid)
    for root, dirs, files in os.walk(directory):
        for name in [*dirs, *files]:
            os.chown(Path(root) / name, user, group)
    os.chown(directory, user, group)


def _agent(options: argparse.Namespace) -> int:
    from controller.credentials import CredentialStore

    _say(f"wrote {CredentialStore(options.dir).issue_agent(options.server_id, options.rotate)}")
    return 0


def _issue(options: argparse.Namespace) -> int:
    from controller.credentials import CredentialStore, Role

    _say(f"wrote {CredentialStore(options.dir).issue(options.name, Role(options.role))}")
    return 0


def _rotate(options: argparse.Namespace) -> int:
    from controller.credentials import CredentialStore

    _say(f"wrote {CredentialStore(options.dir).rotate(options.name)}")
    return 0


def _rotate_agents(options: argparse.Namespace) -> int:
    from controller.credentials import CredentialStore

    CredentialStore(options.dir).rotate_agent_secret()
    _say("agent secret rotated: issue every agent's credential again "
         f"(understudy credentials agent --dir {options.dir} --server-id ID)")
    return 0


def _revoke(options: argparse.Namespace) -> int:
    from controller.credentials import CredentialStore

    CredentialStore(options.dir).revoke(options.name)
    _say(f"revoked {options.name}")
    return 0


def _list(options: argparse.Namespace) -> int:
    from controller.credentials import CredentialStore

    for name, role in CredentialStore(options.dir).names():
        _say(f"{name:20} {role.value}")
    return 0


def _tls(options: argparse.Namespace) -> int:
    from controller.tls import make_ca_and_server_cert

    files = make_ca_and_server_cert(options.out, options.host)
    _say(f"CA {files.ca_cert} (key {files.ca_key}); server certificate {files.server_cert}, "
         f"key {files.server_key}")
    _say(f"controller: --tls-cert {files.server_cert} --tls-key {files.server_key}; "
         f"agents, gateway, clients: --ca-file {files.ca_cert}")
    return 0


_ACTIONS = {"init": _init, "agent": _agent, "issue": _issue, "rotate": _rotate,
            "rotate-agents": _rotate_agents, "revoke": _revoke, "list": _list, "tls": _tls}
