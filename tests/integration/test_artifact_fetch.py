"""The agent's model repository fetching artifacts over real HTTP (the controller's layout).

A small threaded HTTP server serves ``/<variant>/manifest.json`` and ``/<variant>/weights.pt``
from a real artifact store and counts the weight downloads.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agent.repository import ArtifactFetchError, ModelRepository
from model_repo.artifacts import WEIGHTS_FILE, find_variant


class _StoreServer:
    def __init__(self, store: Path) -> None:
        self.store = store
        self.downloads: Counter[str] = Counter()
        self.corrupt = False
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server hook name
                _, variant, name = self.path.split("/")
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
