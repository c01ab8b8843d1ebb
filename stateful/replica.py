"""A replica process: ``python -m stateful.replica --node NAME [--observe-dir DIR] [--nice N]``.

This entry point only sets the process up, before it imports anything heavy (torch, the
protocol cores): it asks Linux to SIGKILL it when its launcher dies (``PR_SET_PDEATHSIG``),
exits if the launcher is already gone, and takes its niceness. Launchers therefore need no
``preexec_fn`` — with one, CPython must fork the launcher (copying its page tables while it
holds the GIL, which stalled an agent's heartbeat loop by milliseconds per replica); without
one it can vfork. What the replica then runs is ``stateful.replica_process``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path

from understudy.lifetime import die_with_parent, orphaned

READY = "READY"
"""First stdout word of a replica that listens, followed by its ``host:port``."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stateful.replica")
    parser.add_argument("--node", required=True, help="replica id (never reused)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--observe-dir", type=Path, default=None,
                        help="write checker observations to DIR/<node>.jsonl")
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument("--nice", type=int, default=0,
                        help="absolute niceness to run at (0: keep the launcher's)")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="the launcher's pid: exit at once if it is no longer our parent")
    options = parser.parse_args(argv)
    # Started by an agent or by a local graph's runtime: never outlive it (a SIGKILLed
    # launcher used to leave its replicas running, holding ports and CPU).
    die_with_parent()
    if orphaned(options.parent_pid):
        return 1
    if options.nice:
        # Absolute, not relative: an agent at a raised priority must not lift its replicas
        # (data plane) with it. Before torch is imported, the bulk of a replica's start.
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, options.nice)
    logging.basicConfig(level=options.log_level, stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s {options.node} %(name)s: %(message)s")
    import asyncio

    from stateful.replica_process import serve

    asyncio.run(serve(options.node, options.host, options.observe_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
