"""A replica process once its entry point (``stateful.replica_main``) has set it up.

It starts blank (a warm standby: torch imported, nothing loaded), listens on a free port,
announces its address (the entry point prints ``READY <host:port>`` on stdout) and then serves
whatever role the manager's configs give it (stateless operator, stateful primary or backup;
HAMS's proxy and model in one process). The graph spec, mode and noise arrive with the first
config, so the same process image serves any graph. SIGTERM or SIGINT stops it at once
(connections closed, no interpreter teardown); the launcher (a local graph's runtime or an
agent) watches it and reports its death to the manager.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO

from stateful.checker import observation_to_json
from stateful.core.effects import Effect, Observe
from stateful.core.replica_node import ReplicaNode
from stateful.host import ModelHost
from stateful.messages import Configure, GraphConfig, Resume
from stateful.nodehost import NodeHost

logger = logging.getLogger(__name__)


class ReplicaProcess(NodeHost):
    """One ``ReplicaNode`` with its model executor, observation log and config hook."""

    def __init__(self, node: str, *, host: str = "127.0.0.1",
                 observe: IO[str] | None = None) -> None:
        super().__init__(host, outcome=self._outcome)
        self.node = node
        self.observe = observe
        self.add(node, ReplicaNode(node))

    def _deliver(self, src: str, dst: str, msg: object) -> None:
        if isinstance(msg, Configure | Resume):
            self._on_config(msg.config)
        super()._deliver(src, dst, msg)

    def _on_config(self, config: GraphConfig) -> None:
        self.learn(config.addresses)
        mbps = config.options.link_mbps
        self.transport.link_bps = mbps * 1e6 if mbps else None
        if self.node not in self.executors:
            self.attach_model(self.node, ModelHost(config.graph, self.node, config.options.noise))

    def _outcome(self, node: str, effect: Effect) -> None:
        if isinstance(effect, Observe) and self.observe is not None:
            # One write per line: a SIGKILL never leaves a torn record behind a complete one.
            self.observe.write(observation_to_json(effect.event) + "\n")
            self.observe.flush()


async def serve(node: str, host: str, observe_dir: Path | None,
                announce: Callable[[str], None]) -> None:
    """Run replica ``node`` until SIGTERM/SIGINT; ``announce(address)`` once it listens."""
    import torch

    torch.set_num_threads(1)  # small models, shared cores: intra-op threads only add contention
    observe = None
    if observe_dir is not None:
        observe_dir.mkdir(parents=True, exist_ok=True)
        observe = (observe_dir / f"{node}.jsonl").open("a", encoding="utf-8")
    process = ReplicaProcess(node, host=host, observe=observe)
    address = await process.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    announce(address)
    await stop.wait()
    logger.info("%s: stopping", node)
    await process.close()
    if observe is not None:
        observe.close()
    # Exit now: what is left is the interpreter's teardown (torch's among it), 0.3-0.5 s of
    # CPU per process, seconds when a graph's replicas all stop at once on a loaded machine
    # (a graph delete waited for it). Everything that matters is closed or flushed above; the
    # kernel closes the inbound connections.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
