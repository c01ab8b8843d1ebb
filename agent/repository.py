"""The agent's local Triton model repository, materialised from the artifact store.

An artifact source is either a local store directory (``understudy models build --out``) or an
HTTP base URL (the controller serves ``{base}/{variant}/manifest.json`` and the one artifact file
the manifest names: ``weights.pt`` of a generated network, ``model.onnx`` or ``model.pt`` of an
imported one, ``model.tar`` of a Triton directory). Artifacts fetched over HTTP are cached under
the agent's run directory and checked against the manifest's sha256 before use; a local store's
are used in place. Each ``<app>__<variant>`` directory gets a ``config.pbtxt`` rendered for its
name and a copy of the model code from this installation (or, for a Triton directory served as
it is, the directory unpacked with its config renamed), written atomically.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path

from model_repo.artifacts import (
    MANIFEST_FILE,
    MODEL_SOURCE,
    ArtifactError,
    Manifest,
    file_sha256,
    find_variant,
    list_store,
    render_model_config,
)
from model_repo.imported import unpack_triton_directory

logger = logging.getLogger(__name__)


CACHE_DIR = "artifact-cache"
"""Name of the directory, in an agent's run directory, of its downloaded, sha256-verified
weights (kept across testbed runs by ``deploy.testbed``)."""


class UnknownVariantError(ArtifactError):
    """The artifact source does not hold the requested variant (a final error)."""


class ArtifactFetchError(ArtifactError):
    """Fetching an artifact over HTTP failed (worth retrying)."""

    retryable = True


class ModelRepository:
    """Materialises ``<app>__<variant>`` model directories for the local Triton."""

    def __init__(self, source: str, repository: Path, cache: Path, token: str | None = None,
                 timeout_s: float = 120.0, mirror: Path | None = None,
                 backend: str = "python", device: str = "cpu",
                 ca_file: Path | None = None) -> None:
        self.source = source
        self.backend = backend
        """The Triton backend models are written for (the server's ``model_backend``)."""
        self.device = device
        """Where models are placed: ``cpu``, or ``cuda:N`` on a server with a GPU."""
        self.repository = repository
        self.cache = cache
        self.token = token
        self.ca_file = ca_file
        """CA that verifies an ``https://`` source (None: the system's CAs)."""
        self.timeout_s = timeout_s
        self.mirror = mirror
        """A local copy of the HTTP source's store (same host, shared filesystem): weights whose
        sha256 matches the served manifest are linked from it instead of downloaded."""
        # Loads of several apps' copies of one variant run in parallel threads; one download
        # per variant at a time (the others then find it cached).
        self._fetch_locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._client: object | None = None
        repository.mkdir(parents=True, exist_ok=True)
        cache.mkdir(parents=True, exist_ok=True)
        # Model directories are written, and deleted, beside the repository and moved in or
        # out with one rename: Triton's repository index stats every entry it lists, and one
        # that vanishes between the listing and the stat fails the whole index call (an
        # unload waiting on the index failed that way on an interim's temporary directory).
        # A model moved out can still race a listing; TritonServer.repository_index retries.
        self.staging = repository.parent / f".{repository.name}.staging"
        self.staging.mkdir(parents=True, exist_ok=True)

    @property
    def remote(self) -> bool:
        """Whether the source is an HTTP URL."""
        return self.source.startswith(("http://", "https://"))

    def materialise(self, model_name: str, variant: str,
                    manifest: Manifest | None = None, urgent: bool = True) -> Manifest:
        """Write (or refresh) the model directory; returns the variant's manifest.

        ``manifest``, sent by the controller with the load, spares an HTTP source the manifest
        request: weights cached with its sha256 are used at once (a load on the failover's
        critical path asks the controller nothing). A local store is always read directly.
        ``urgent`` (the load ends an outage) goes into the config: the runtime lets only such
        loads outrank the server's inference.
        """
        manifest, weights = self._weights(variant, manifest)
        target = self.repository / model_name
        work = Path(tempfile.mkdtemp(prefix=f"{model_name}.", dir=self.staging))
        try:
            if manifest.format == "triton":
                unpack_triton_directory(weights, work, model_name)
            else:
                (work / "1").mkdir()
                shutil.copyfile(MODEL_SOURCE, work / "1" / "model.py")
                (work / "config.pbtxt").write_text(
                    render_model_config(model_name, manifest, str(weights), self.backend,
                                        self.device, urgent), encoding="utf-8")
            if target.exists():  # a reload: the old directory leaves in one rename too
                os.replace(target, work.with_name(work.name + ".old"))
            os.replace(work, target)
            shutil.rmtree(work.with_name(work.name + ".old"), ignore_errors=True)
        finally:
            if work.exists():
                shutil.rmtree(work, ignore_errors=True)
        return manifest

    def prefetch(self, variant: str, manifest: Manifest | None = None) -> bool:
        """Make sure the variant's verified weights are in the cache; no model is written.

        Returns whether anything had to be fetched (False: already cached, or a local store,
        which is read in place).
        """
        if not self.remote:
            self._weights(variant, manifest)  # an unknown variant still fails loudly
            return False
        if manifest is not None and _verified_sha256(
                self.cache / variant / manifest.weights_file) == manifest.weights_sha256:
            return False
        self._fetch(variant, manifest)
        return True

    def remove(self, model_name: str) -> None:
        """Delete a model directory (after its unload): moved out first, then deleted."""
        doomed = Path(tempfile.mkdtemp(prefix=f"{model_name}.removed.", dir=self.staging))
        try:
            os.replace(self.repository / model_name, doomed / model_name)
        except FileNotFoundError:
            pass
        shutil.rmtree(doomed, ignore_errors=True)

    def _weights(self, variant: str, known: Manifest | None) -> tuple[Manifest, Path]:
        if not self.remote:
            try:
                entry = find_variant(Path(self.source), variant)
            except ArtifactError as exc:
                raise UnknownVariantError(str(exc)) from exc
            return entry.manifest, (entry.directory / entry.manifest.weights_file).resolve()
        if known is not None and known.variant != variant:
            raise UnknownVariantError(f"the manifest sent for {variant!r} is {known.variant!r}'s")
        return self._fetch(variant, known)

    def _fetch(self, variant: str, known: Manifest | None) -> tuple[Manifest, Path]:
        base = self.source.rstrip("/")
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        directory = self.cache / variant
        if known is not None:
            weights = directory / known.weights_file
            if _verified_sha256(weights) == known.weights_sha256:
                return known, weights.resolve()  # no lock needed: nothing to write
        with self._locks_guard:
            lock = self._fetch_locks.setdefault(variant, threading.Lock())
        with lock:
            return self._fetch_locked(variant, base, headers, directory, known)

    def _http(self, headers: dict[str, str]) -> object:
        """The repository's one HTTP client, made on first use.

        Creating a client costs 35-60 ms here (its TLS context), which every interim load used
        to pay on the failover's critical path.
        """
        import httpx

        with self._locks_guard:
            if self._client is None:
                from understudy.wire.credentials import client_ssl_context

                self._client = httpx.Client(timeout=self.timeout_s, headers=headers,
                                            verify=client_ssl_context(self.ca_file))
            return self._client

    def close(self) -> None:
        """Release the HTTP client's connections."""
        with self._locks_guard:
            client, self._client = self._client, None
        if client is not None:
            client.close()  # type: ignore[attr-defined]

    def _fetch_locked(self, variant: str, base: str, headers: dict[str, str],
                      directory: Path, known: Manifest | None) -> tuple[Manifest, Path]:
        import httpx

        client = self._http(headers)
        assert isinstance(client, httpx.Client)  # noqa: S101 - built by _http
        try:
            manifest = known
            if manifest is None:
                response = client.get(f"{base}/{variant}/{MANIFEST_FILE}")
                if response.status_code == 404:
                    raise UnknownVariantError(f"variant {variant!r} is not served by {base}")
                response.raise_for_status()
                manifest = Manifest.model_validate_json(response.content)
            weights = directory / manifest.weights_file
            if _verified_sha256(weights) != manifest.weights_sha256:
                self._download(client, f"{base}/{variant}/{manifest.weights_file}", weights,
                               manifest.weights_sha256)
        except httpx.HTTPError as exc:
            raise ArtifactFetchError(f"fetching {variant} from {base}: {exc}") from exc
        return manifest, weights.resolve()

    def _download(self, client: object, url: str, target: Path, sha256: str) -> None:
        import httpx

        assert isinstance(client, httpx.Client)  # noqa: S101 - internal call
        target.parent.mkdir(parents=True, exist_ok=True)
        if self.mirror is not None and _link_from_mirror(self.mirror, target, sha256):
            return
        # A unique partial file: a download left by a crashed agent never collides with this one.
        handle, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial",
                                        dir=target.parent)
        partial = Path(name)
        digest = hashlib.sha256()
        try:
            with os.fdopen(handle, "wb") as out, client.stream("GET", url) as response:
                response.raise_for_status()
                for block in response.iter_bytes(1 << 20):
                    digest.update(block)
                    out.write(block)
            if digest.hexdigest() != sha256:
                raise ArtifactFetchError(f"{url}: sha256 mismatch (download corrupted)")
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        _mark_verified(target, sha256)
        logger.info("fetched %s (%.1f MB)", url, target.stat().st_size / 1e6)


def _marker(weights: Path) -> Path:
    return weights.with_name(weights.name + ".sha256")


def _mark_verified(weights: Path, sha256: str) -> None:
    """Record that ``weights`` (as they are now) were checked against ``sha256``."""
    _marker(weights).write_text(f"{weights.stat().st_size} {sha256}\n", encoding="ascii")


def _verified_sha256(weights: Path) -> str | None:
    """The sha256 recorded when ``weights`` was downloaded and checked, if the file is intact.

    Hashing a cached file on every load would add ~1 s per GB to each load, so the check is done
    once after the download; a size change (truncation, replacement) invalidates it.
    """
    try:
        size, sha = _marker(weights).read_text(encoding="ascii").split()
        if int(size) == weights.stat().st_size:
            return sha
    except (OSError, ValueError):
        pass
    return None


def _link_from_mirror(mirror: Path, target: Path, sha256: str) -> bool:
    """Put the mirror's weights with this ``sha256`` at ``target`` (verified); False: download.

    The file is found by content (the manifest's sha256), hard-linked (copied across file
    systems) into a partial file, hashed, and only then moved into place with its marker, so a
    stale, rebuilt or corrupted mirror falls back to the HTTP download. On one machine this saves
    the controller serving, and the agent receiving, every byte (2 GB for the demo set while all
    agents register at once, which starved heartbeats into false failure alarms).
    """
    try:
        source = next((e.directory / e.manifest.weights_file for e in list_store(mirror)
                       if e.manifest.weights_sha256 == sha256), None)
    except (ArtifactError, OSError, ValueError) as exc:
        logger.warning("artifact mirror %s unusable (%s); downloading", mirror, exc)
        return False
    if source is None:
        return False
    handle, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial",
                                    dir=target.parent)
    os.close(handle)
    partial = Path(name)
    try:
        partial.unlink()
        try:
            os.link(source, partial)
        except OSError:  # another file system, or links not allowed
            shutil.copyfile(source, partial)
        if file_sha256(partial) != sha256:
            logger.warning("%s in the artifact mirror does not match its manifest; downloading",
                           source)
            return False
        os.replace(partial, target)
    except OSError as exc:
        logger.warning("linking %s from the artifact mirror failed (%s); downloading", source,
                       exc)
        return False
    finally:
        partial.unlink(missing_ok=True)
    _mark_verified(target, sha256)
    logger.info("linked %s from the artifact mirror (%.1f MB)", source,
                target.stat().st_size / 1e6)
    return True
