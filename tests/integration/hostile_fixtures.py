"""Helpers shared by the hostile-input and fuzzing tests of the controller."""

from __future__ import annotations

from pathlib import Path

from understudy.wire.artifacts import Manifest

VARIANTS = {"mobilenet_v3": ("mobilenet_v3_small", "mobilenet_v3_large"),
            "shufflenet_v2": ("shufflenet_v2_x0_5",)}
"""What :func:`artifact_store` holds, by family."""


def artifact_store(root: Path) -> Path:
    """A store of three variants (manifests and placeholder weights; nothing loads them)."""
    for family, variants in VARIANTS.items():
        for variant in variants:
            directory = root / family / variant
            directory.mkdir(parents=True)
            (directory / "weights.pt").write_bytes(b"w")
            (directory / "manifest.json").write_text(Manifest(
                family=family, variant=variant, profiled_size_mb=1.0, scale=0.1,
                weights_mb=0.1, weights_sha256="0" * 64, spec={"width": 8},
                max_batch_size=1).model_dump_json())
    return root
