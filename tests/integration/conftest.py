"""Fixtures for tests against real processes: Triton, agents, Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from model_repo.artifacts import build_store
from model_repo.profiles import load_families

TEST_SCALE = 0.1
"""Artifact scale for tests: mobilenet_v3 small/large become ~1 MB / ~2 MB of weights."""


@pytest.fixture(scope="session")
def artifact_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A small artifact store (two mobilenet_v3 variants, one shufflenet) built once per run."""
    store = tmp_path_factory.mktemp("artifacts")
    families = load_families()
    build_store(store, [families["mobilenet_v3"], families["shufflenet_v2"]], scale=TEST_SCALE,
                variants=["mobilenet_v3_small", "mobilenet_v3_large", "shufflenet_v2_x0_5"])
    yield store
