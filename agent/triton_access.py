"""Who may reach Triton: the address it listens on, and the key that guards model control.

Inference, health, metadata, model configuration and statistics are open to every client that
reaches Triton's address. Model control (load, unload, the repository index) and the APIs that
change Triton's trace, log or shared-memory settings answer only requests that carry the key of
this Triton start in :data:`MODEL_CONTROL_HEADER` (Triton's ``--http-restricted-api`` and
``--grpc-restricted-protocol``). The key is new at every start, known to the agent, and kept in
``<work_dir>/model-control.key`` (mode 0600) for tools run by the same user.
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path

from understudy.wire.secret_files import read_secret_file

MODEL_CONTROL_HEADER = "understudy-model-control"
"""HTTP header carrying the model-control key (lower case: gRPC metadata keys must be)."""
GRPC_MODEL_CONTROL_HEADER = f"triton-grpc-protocol-{MODEL_CONTROL_HEADER}"
"""The gRPC metadata key carrying it: Triton looks for restricted-protocol keys under this
prefix."""
RESTRICTED_APIS = "model-repository,trace,logging,shared-memory"
"""Triton APIs only the agent may call: loading and unloading models and the repository index;
the trace and log settings (they name files Triton writes); shared-memory regions (a client
could map Triton onto other processes' shared memory)."""
MODEL_CONTROL_KEY_FILE = "model-control.key"
"""The key's file in Triton's work directory."""


def restriction_args(key: str) -> list[str]:
    """``tritonserver`` options that restrict :data:`RESTRICTED_APIS` to holders of ``key``.

    Triton takes the key nowhere but its command line, so local users who can read
    ``/proc/<pid>/cmdline`` can read it (unless ``/proc`` is mounted with ``hidepid``): the
    restriction keeps clients on the network from loading and unloading, not other users of
    the server.
    """
    restricted = f"{RESTRICTED_APIS}:{MODEL_CONTROL_HEADER}={key}"
    return [f"--http-restricted-api={restricted}", f"--grpc-restricted-protocol={restricted}"]


def bind_address(host: str) -> str:
    """The IP address to listen on for ``host`` (Triton's HTTP server takes no host names)."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return socket.gethostbyname(host)


def is_every_interface(address: str) -> bool:
    """Whether ``address`` is the wildcard (every interface)."""
    return address in ("0.0.0.0", "::")  # noqa: S104


def model_control_headers(work_dir: Path, grpc: bool = False) -> dict[str, str]:
    """The header (``grpc``: metadata) that controls the Triton working in ``work_dir``.

    ``work_dir`` is the agent's ``<run_dir>/triton``; for checks and tests run by the agent's
    user, not for clients.
    """
    name = GRPC_MODEL_CONTROL_HEADER if grpc else MODEL_CONTROL_HEADER
    return {name: read_secret_file(work_dir / MODEL_CONTROL_KEY_FILE)}
