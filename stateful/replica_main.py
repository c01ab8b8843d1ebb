"""A replica process: ``python -m stateful.replica_main --node NAME [--observe-dir DIR]``.

This entry point sets the process up before it imports anything heavy (torch, the protocol
cores): it asks Linux to SIGKILL it when its launcher dies (``PR_SET_PDEATHSIG``) and exits if
the launcher is already gone (``--parent-pid``). Launchers therefore need no ``preexec_fn`` —
with one, CPython must fork the launcher (copying its page tables while it holds the GIL, which
stalled an agent's heartbeat loop by milliseconds per replica); without one it can vfork. What
the replica then runs is ``stateful.replica_server``; once it listens, this module prints the
launcher's handshake, ``READY <host:port>``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from understudy.wire.lifetime import die_with_parent, orphaned

READY = "READY"
"""First stdout word of a replica that listens, followed by its ``host:port``."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stateful.replica_main")
    parser.add_argument("--node", required=True, help="replica id (never reused)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--observe-dir", type=Path, default=None,
                        help="write checker observations to DIR/<node>.jsonl")
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="the launcher's pid: exit at once if it is no longer our parent")
    options = parser.parse_args(argv)
    # Started by an agent or by a local graph's runtime: never outlive it (a SIGKILLed
    # launcher used to leave its replicas running, holding ports and CPU).
    die_with_parent()
    if orphaned(options.parent_pid):
        return 1
    logging.basicConfig(level=options.log_level, stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s {options.node} %(name)s: %(message)s")
    import asyncio

    from stateful.replica_server import serve

    asyncio.run(serve(options.node, options.host, options.observe_dir, announce=_announce))
    return 0


def _announce(address: str) -> None:
    """The launcher's handshake: the first stdout line says where the replica listens."""
    sys.stdout.write(f"{READY} {address}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
