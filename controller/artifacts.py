"""The controller's view of the artifact store it serves to the agents.

A load command carries the variant's manifest, so an agent whose cache already holds verified
weights loads without any request back to the controller. That round trip used to sit on the
failover's critical path (10-50 ms per interim, more while this event loop is busy with the
failover itself). Manifests are cached per variant and re-read when the manifest file changes
(``understudy models build --rebuild`` while the controller runs).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from model_repo.artifacts import MANIFEST_FILE, ArtifactError, Manifest, StoreEntry, find_variant

logger = logging.getLogger(__name__)


class ArtifactCatalog:
    """Variant -> store entry, cached; ``None`` store: the agents use their own source."""

    def __init__(self, store: Path | None) -> None:
        self.store = store
        self._entries: dict[str, tuple[StoreEntry, int]] = {}

    async def entry(self, variant: str) -> StoreEntry:
        """The variant's store entry; ArtifactError when the store does not hold it."""
        if self.store is None:
            raise ArtifactError("the controller serves no artifact store")
        cached = self._entries.get(variant)
        if cached is not None:
            entry, stamp = cached
            if _stamp(entry.directory) == stamp:
                return entry
        # A directory scan and a manifest parse: off the event loop the detector runs on.
        entry = await asyncio.to_thread(find_variant, self.store, variant)
        self._entries[variant] = (entry, _stamp(entry.directory))
        return entry

    async def manifest(self, variant: str) -> Manifest | None:
        """The manifest to send with a load command, or ``None`` (the agent fetches it)."""
        if self.store is None:
            return None
        try:
            return (await self.entry(variant)).manifest
        except ArtifactError as exc:
            # The agent's own fetch then reports the error on the load itself.
            logger.warning("no manifest for %s to send with its load: %s", variant, exc)
            return None


def _stamp(directory: Path) -> int:
    """Changes whenever the manifest is rewritten (or removed)."""
    try:
        return (directory / MANIFEST_FILE).stat().st_mtime_ns
    except OSError:
        return -1
