"""``controller.prefetch.interim_variants``: which weights every server caches ahead."""

from __future__ import annotations

from controller.prefetch import interim_variants
from model_repo.profiles import load_families


def test_each_family_in_use_contributes_its_smallest_variant_once() -> None:
    families = load_families()
    in_use = ["convnext", "mobilenet_v3", "convnext", "unknown_family"]
    assert interim_variants(families, in_use) == sorted(
        {families["convnext"].variants[0].name, families["mobilenet_v3"].variants[0].name})
    assert interim_variants(families, []) == []
