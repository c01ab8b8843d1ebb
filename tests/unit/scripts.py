"""Loading the repository's scripts (``bench/*.py``), which are not a package, in tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def load_script(relative: str) -> ModuleType:
    """The script at ``relative`` (from the repository root), imported as a module."""
    path = REPO / relative
    if str(path.parent) not in sys.path:  # as running it does: its siblings import
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module
