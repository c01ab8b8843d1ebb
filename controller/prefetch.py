"""Interim weights on every server before they are needed.

A progressive failover first loads each affected app's interim, the smallest variant of its
family, on whichever server has room. If that server has never held the variant, the load
starts by fetching (or, from a local mirror, hashing) its weights: 130-170 ms measured for a
first-time convnext_tiny on the live testbed, and a download over the network from the
controller in a real deployment, all inside the outage. So whenever an app is registered or a
server (re)joins, every up server is asked to cache the smallest variant of every family in use
(``PrefetchCommand``: disk only, no memory). It is an optimisation, not state: nothing is
written to Redis, and a prefetch that fails is retried at the next registration or join.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from controller.errors import AgentCommandError, AgentUnavailableError
from controller.interfaces import AgentLink, ManifestSource, RecordStore
from controller.records import ServerState
from policies.model import Family

logger = logging.getLogger(__name__)


def interim_variants(families: Mapping[str, Family], in_use: Iterable[str]) -> list[str]:
    """The smallest variant of each known family in ``in_use``, sorted."""
    return sorted({families[name].smallest.name for name in in_use if name in families})


class InterimPrefetcher:
    """Keeps the interim variants' weights cached on every up server."""

    def __init__(self, store: RecordStore, agents: AgentLink, artifacts: ManifestSource,
                 families: Mapping[str, Family],
                 spawn: Callable[[Awaitable[Any], str], object]) -> None:
        self.store = store
        self.agents = agents
        self.artifacts = artifacts
        self.families = families
        self.spawn = spawn
        self._asked: set[tuple[str, str]] = set()
        """(server, variant) pairs sent (or being sent) since the server's last join."""

    def server_joined(self, server_id: str) -> None:
        """A (re)joined agent may have a fresh cache: ask it again."""
        self._asked = {key for key in self._asked if key[0] != server_id}
        self.request()

    def request(self) -> None:
        """Bring every up server's cache up to date, in the background."""
        self.spawn(self.run(), "prefetch interim variants")

    async def run(self) -> None:
        """Send the prefetches not yet sent (one task per server and variant)."""
        view = await self.store.view()
        variants = interim_variants(self.families, {r.spec.family for r in view.apps.values()})
        for server_id, server in sorted(view.servers.items()):
            if server.state is not ServerState.UP or not self.agents.connected(server_id):
                continue
            for variant in variants:
                if (server_id, variant) not in self._asked:
                    self._asked.add((server_id, variant))
                    self.spawn(self._prefetch(server_id, variant),
                            f"prefetch {variant} on {server_id}")

    async def _prefetch(self, server_id: str, variant: str) -> None:
        try:
            manifest = await self.artifacts.manifest(variant)
            result = await self.agents.prefetch(server_id, variant, manifest)
        except (AgentUnavailableError, AgentCommandError) as exc:
            self._asked.discard((server_id, variant))
            logger.warning("prefetch of %s on %s: %s", variant, server_id, exc)
            return
        if not result.already:
            logger.info("server %s cached %s's weights in %.0f ms", server_id, variant,
                        result.timings.get("total_s", 0.0) * 1000)
