"""Test tiers by directory: tests under ``tests/unit`` are marked ``unit``, those under
``tests/integration`` ``integration`` (``pytest -m unit`` is ``make test-fast``)."""

from __future__ import annotations

from pathlib import Path

import pytest

_TIERS = {Path(__file__).parent / "unit": pytest.mark.unit,
          Path(__file__).parent / "integration": pytest.mark.integration}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for directory, marker in _TIERS.items():
            if item.path.is_relative_to(directory):
                item.add_marker(marker)
