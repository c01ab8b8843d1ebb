"""Running one test's asyncio scenario: a fresh event loop, and a limit instead of a hang."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

TEST_LIMIT_S = 10.0
"""How long one test's scenario may run before it fails rather than hangs."""


def run(body: Callable[[], Awaitable[Any]], limit_s: float = TEST_LIMIT_S) -> Any:
    """Run one test's scenario on a fresh event loop, failing it after ``limit_s``."""
    return asyncio.run(asyncio.wait_for(body(), limit_s))
