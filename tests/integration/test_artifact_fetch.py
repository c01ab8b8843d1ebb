"""The agent's model repository fetching artifacts over real HTTP (the controller's layout).

A small threaded HTTP server serves ``/<variant>/manifest.json`` and ``/<variant>/weights.pt``
from a real artifact store and counts the weight downloads.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agent.repository import ArtifactFetchError, ModelRepository, UnknownVariantError
from model_repo.artifacts import WEIGHTS_FILE, find_variant


class _StoreServer:
    def __init__(self, store: Path) -> None:
        self.store = store
        self.downloads: Counter[str] = Counter()
        self.requests: Counter[str] = Counter()
        self.corrupt = False
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server hook name
                _, variant, name = self.path.split("/")
                outer.requests[variant] += 1
                try:
                    directory = find_variant(outer.store, variant).directory
                except Exception:  # noqa: BLE001 - any lookup failure is a 404 here
                    self.send_error(404)
                    return
                body = (directory / name).read_bytes()
                if name == WEIGHTS_FILE:
                    outer.downloads[variant] += 1
                    if outer.corrupt:
                        body = body[:-1] + bytes([body[-1] ^ 0xFF])
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def served(artifact_store: Path) -> Iterator[_StoreServer]:
    server = _StoreServer(artifact_store)
    yield server
    server.close()


def test_parallel_loads_of_one_variant_download_it_once(served: _StoreServer,
                                                        tmp_path: Path) -> None:
    repository = ModelRepository(served.url, tmp_path / "repo", tmp_path / "cache")
    names = [f"app-{i}__mobilenet_v3_small" for i in range(6)]
    with ThreadPoolExecutor(len(names)) as pool:
        manifests = list(pool.map(
            lambda name: repository.materialise(name, "mobilenet_v3_small"), names))
    assert {m.variant for m in manifests} == {"mobilenet_v3_small"}
    assert served.downloads["mobilenet_v3_small"] == 1
    for name in names:
        config = (tmp_path / "repo" / name / "config.pbtxt").read_text()
        assert f'name: "{name}"' in config
    cached = tmp_path / "cache" / "mobilenet_v3_small"
    assert not list(cached.glob("*.partial"))
    original = find_variant(served.store, "mobilenet_v3_small").directory / WEIGHTS_FILE
    assert (cached / WEIGHTS_FILE).read_bytes() == original.read_bytes()
    # A later load finds the verified copy and downloads nothing.
    repository.materialise("app-9__mobilenet_v3_small", "mobilenet_v3_small")
    assert served.downloads["mobilenet_v3_small"] == 1


def test_a_corrupted_download_is_refused_and_leaves_nothing_behind(served: _StoreServer,
                                                                   tmp_path: Path) -> None:
    repository = ModelRepository(served.url, tmp_path / "repo", tmp_path / "cache")
    served.corrupt = True
    with pytest.raises(ArtifactFetchError, match="sha256 mismatch"):
        repository.materialise("app-0__shufflenet_v2_x0_5", "shufflenet_v2_x0_5")
    cached = tmp_path / "cache" / "shufflenet_v2_x0_5"
    assert not (cached / WEIGHTS_FILE).exists()
    assert not list(cached.glob("*.partial"))
    assert not (tmp_path / "repo" / "app-0__shufflenet_v2_x0_5").exists()
    served.corrupt = False
    manifest = repository.materialise("app-0__shufflenet_v2_x0_5", "shufflenet_v2_x0_5")
    assert manifest.variant == "shufflenet_v2_x0_5"
    assert (tmp_path / "repo" / "app-0__shufflenet_v2_x0_5" / "1" / "model.py").exists()


def test_a_load_sent_with_its_manifest_asks_the_server_only_for_missing_weights(
        served: _StoreServer, tmp_path: Path) -> None:
    """The controller sends the manifest with each load: cached verified weights then load
    with no request at all (the interim's path during a failover)."""
    repository = ModelRepository(served.url, tmp_path / "repo", tmp_path / "cache")
    manifest = find_variant(served.store, "mobilenet_v3_small").manifest
    repository.materialise("app-0__mobilenet_v3_small", "mobilenet_v3_small", manifest)
    assert served.requests["mobilenet_v3_small"] == 1  # the weights only, no manifest request
    assert served.downloads["mobilenet_v3_small"] == 1
    used = repository.materialise("app-1__mobilenet_v3_small", "mobilenet_v3_small", manifest)
    assert used == manifest
    assert served.requests["mobilenet_v3_small"] == 1
    config = (tmp_path / "repo" / "app-1__mobilenet_v3_small" / "config.pbtxt").read_text()
    assert str((tmp_path / "cache" / "mobilenet_v3_small" / WEIGHTS_FILE).resolve()) in config
    # A manifest naming other weights (the store was rebuilt) fetches them again, checked
    # against the new sha256: the stale copy is never served.
    rebuilt = manifest.model_copy(update={"weights_sha256": "0" * 64})
    with pytest.raises(ArtifactFetchError, match="sha256 mismatch"):
        repository.materialise("app-2__mobilenet_v3_small", "mobilenet_v3_small", rebuilt)
    assert served.downloads["mobilenet_v3_small"] == 2
    wrong = find_variant(served.store, "shufflenet_v2_x0_5").manifest
    with pytest.raises(UnknownVariantError, match="shufflenet_v2_x0_5"):
        repository.materialise("app-3__mobilenet_v3_small", "mobilenet_v3_small", wrong)


def test_the_controller_catalog_caches_manifests_until_the_store_changes(
        artifact_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    import controller.artifacts as catalog_module
    from controller.artifacts import ArtifactCatalog
    from model_repo.artifacts import MANIFEST_FILE

    scans: list[str] = []
    real = catalog_module.find_variant

    def counting(store: Path, variant: str) -> object:
        scans.append(variant)
        return real(store, variant)

    monkeypatch.setattr(catalog_module, "find_variant", counting)
    catalog = ArtifactCatalog(artifact_store)

    async def scenario() -> None:
        first = await catalog.manifest("mobilenet_v3_small")
        assert first == find_variant(artifact_store, "mobilenet_v3_small").manifest
        assert await catalog.manifest("mobilenet_v3_small") == first
        assert scans == ["mobilenet_v3_small"]
        # Rewritten (a rebuild): read again.
        path = (await catalog.entry("mobilenet_v3_small")).directory / MANIFEST_FILE
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
        assert await catalog.manifest("mobilenet_v3_small") == first
        assert scans == ["mobilenet_v3_small"] * 2
        assert await catalog.manifest("no_such_variant") is None
        assert await ArtifactCatalog(None).manifest("mobilenet_v3_small") is None

    asyncio.run(scenario())


def test_a_prefetch_caches_weights_so_the_load_asks_nothing(served: _StoreServer,
                                                            tmp_path: Path) -> None:
    """What the controller sends every server for each family's interim variant."""
    repository = ModelRepository(served.url, tmp_path / "repo", tmp_path / "cache")
    manifest = find_variant(served.store, "mobilenet_v3_small").manifest
    assert repository.prefetch("mobilenet_v3_small", manifest) is True
    assert served.downloads["mobilenet_v3_small"] == 1
    assert not list((tmp_path / "repo").iterdir())  # weights only: no model directory
    assert repository.prefetch("mobilenet_v3_small", manifest) is False  # already there
    repository.materialise("app-0__mobilenet_v3_small", "mobilenet_v3_small", manifest)
    assert served.requests["mobilenet_v3_small"] == 1  # the prefetch's download, nothing since
    with pytest.raises(UnknownVariantError):
        repository.prefetch("no_such_variant")
    local = ModelRepository(str(served.store), tmp_path / "repo2", tmp_path / "cache2")
    assert local.prefetch("mobilenet_v3_small") is False  # a local store is read in place
