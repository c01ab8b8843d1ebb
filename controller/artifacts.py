"""The controller's view of the artifact store it serves to the agents.

A load command carries the variant's manifest, so an agent whose cache already holds verified
weights loads without any request back to the controller. That round trip used to sit on the
failover's critical path (10-50 ms per interim, more while this event loop is busy with the
failover itself). Manifests are cached per variant and re-read when the manifest file changes
(``understudy models build --rebuild`` while the controller runs).

The catalog also says which variants the store holds (:meth:`ArtifactCatalog.variants`):
registration refuses an app whose primary variant no store holds (it would never serve), unless
the app says its artifacts are provided some other way (``AppSpec.artifacts_provided``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from model_repo.artifacts import (
    MANIFEST_FILE,
    ArtifactError,
    Manifest,
    StoreEntry,
    find_variant,
    list_store,
)

logger = logging.getLogger(__name__)

LISTING_MAX_AGE_S = 1.0
"""How long a listing of the store's variants is used before the store is listed again (a
variant built while the controller runs is known within this)."""


class ArtifactCatalog:
    """Variant -> store entry, cached; ``None`` store: the agents use their own source."""

    def __init__(self, store: Path | None) -> None:
        self.store = store
        self._entries: dict[str, tuple[StoreEntry, int]] = {}
        self._listing: frozenset[str] = frozenset()
        self._listed_at: float | None = None

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

    async def variants(self) -> frozenset[str] | None:
        """The names of the variants the store holds; ``None`` when there is no store.

        Listed again at most every :data:`LISTING_MAX_AGE_S` (a burst of registrations costs
        one listing), off the event loop.
        """
        if self.store is None:
            return None
        stamp = time.monotonic()
        if self._listed_at is None or stamp - self._listed_at > LISTING_MAX_AGE_S:
            entries = await asyncio.to_thread(list_store, self.store)
            self._listing = frozenset(e.variant for e in entries)
            self._listed_at = stamp
        return self._listing

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
