"""An HTTP artifact source with a local mirror: verified weights linked, anything else downloaded.

The testbed's agents run on the machine that holds the store; they take the manifest over HTTP
and the weights from the store once the sha256 matches. A mirror that is stale, corrupted or
lacks the variant must fall back to the real HTTP download (the server here counts them).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.repository import ModelRepository
from model_repo.artifacts import WEIGHTS_FILE, find_variant
from tests.integration.test_artifact_fetch import _StoreServer

VARIANT = "mobilenet_v3_small"


@pytest.fixture()
def served(artifact_store: Path) -> Iterator[_StoreServer]:
    server = _StoreServer(artifact_store)
    yield server
    server.close()


def _repository(served: _StoreServer, tmp_path: Path, mirror: Path) -> ModelRepository:
    return ModelRepository(served.url, tmp_path / "repo", tmp_path / "cache", mirror=mirror)


def test_matching_weights_are_linked_not_downloaded(served: _StoreServer, artifact_store: Path,
                                                    tmp_path: Path) -> None:
    repository = _repository(served, tmp_path, artifact_store)
    manifest = repository.materialise(f"app-1__{VARIANT}", VARIANT)
    assert served.downloads[VARIANT] == 0
    cached = tmp_path / "cache" / VARIANT / WEIGHTS_FILE
    source = find_variant(artifact_store, VARIANT).directory / WEIGHTS_FILE
    assert cached.stat().st_ino == source.stat().st_ino  # a hard link: no copy, no bytes sent
    assert manifest.weights_sha256 == find_variant(artifact_store, VARIANT).manifest.weights_sha256
    assert str(cached) in (tmp_path / "repo" / f"app-1__{VARIANT}" / "config.pbtxt").read_text()
    # verified once: a second app's load neither downloads nor links again
    repository.materialise(f"app-2__{VARIANT}", VARIANT)
    assert served.downloads[VARIANT] == 0 and not list(cached.parent.glob("*.partial"))


def test_corrupted_mirror_falls_back_to_the_download(served: _StoreServer, artifact_store: Path,
                                                     tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    shutil.copytree(artifact_store, mirror)
    weights = find_variant(mirror, VARIANT).directory / WEIGHTS_FILE
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))  # same manifest, other bytes
    repository = _repository(served, tmp_path, mirror)
    repository.materialise(f"app-1__{VARIANT}", VARIANT)
    assert served.downloads[VARIANT] == 1
    cached = tmp_path / "cache" / VARIANT / WEIGHTS_FILE
    served_weights = find_variant(artifact_store, VARIANT).directory / WEIGHTS_FILE
    assert cached.read_bytes() == served_weights.read_bytes()
    assert cached.stat().st_ino != weights.stat().st_ino


def test_mirror_without_the_variant_falls_back_to_the_download(served: _StoreServer,
                                                               artifact_store: Path,
                                                               tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    shutil.copytree(artifact_store, mirror)
    shutil.rmtree(find_variant(mirror, VARIANT).directory)
    repository = _repository(served, tmp_path, mirror)
    repository.materialise(f"app-1__{VARIANT}", VARIANT)
    assert served.downloads[VARIANT] == 1
    missing = _repository(served, tmp_path / "other", tmp_path / "no-such-store")
    missing.materialise(f"app-1__{VARIANT}", VARIANT)
    assert served.downloads[VARIANT] == 2
