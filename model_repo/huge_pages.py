"""Back a process's anonymous heap with transparent huge pages before it forks workers.

The torch runtime (``model_repo.runtime``) imports torch once and forks one worker per model;
after the import its heap holds ~150 MB of anonymous memory (torch's operator registry, Python
modules). ``fork`` copies one page-table entry per 4 KB page of it into every worker, and a
worker's exit (an unload, or a whole server going down) walks them all again: with eight
workers that is most of the CPU a dead server's teardown costs, spent on the cores the
surviving models and the failover's interim loads use. Collapsed into 2 MB pages
(``MADV_COLLAPSE``, Linux 6.1+), the same memory is one entry per 2 MB: on this machine a fork
went from 3.3-3.5 to 1.4-1.5 ms, and eight idle workers killed at once were reaped in 8-9 ms
instead of 18-19 ms, for 15-20 ms of CPU instead of 30 (``bench/runtime_huge_pages.py``,
medians of 6 and 8). A worker that writes to an inherited huge page gets its own
4 KB copy, as before: its private memory does not grow.

Best effort: where the kernel does not allow it (an older kernel, THP compiled out, another
OS) nothing changes and the caller goes on. ``UNDERSTUDY_HEAP_HUGE_PAGES=0``
turns it off (the collapse costs the runtime ~0.3 s once, at start).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
MADV_COLLAPSE = 25
SWITCH_ENV = "UNDERSTUDY_HEAP_HUGE_PAGES"


@dataclass(frozen=True, slots=True)
class CollapseReport:
    """What ``collapse_heap`` did."""

    regions: int
    """Anonymous writable regions of at least one huge page."""
    collapsed: int
    """Regions the kernel collapsed (fully; a refused region may be partly collapsed)."""
    huge_mb: float
    """Anonymous memory in huge pages afterwards."""
    seconds: float


def _anonymous_regions(maps: str) -> list[tuple[int, int]]:
    """Huge-page-aligned parts of the writable anonymous mappings (heap included)."""
    out = []
    for line in maps.splitlines():
        fields = line.split()
        if len(fields) < 5 or not fields[1].startswith("rw"):
            continue
        name = fields[5] if len(fields) > 5 else ""
        if name not in ("", "[heap]"):
            continue
        low, high = (int(x, 16) for x in fields[0].split("-"))
        start = (low + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
        end = high & ~(HUGE_PAGE - 1)
        if end > start:
            out.append((start, end))
    return out


def _anon_huge_mb() -> float:
    total_kb = 0
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            total_kb = int(line.split()[1])
    return total_kb / 1024


def collapse_heap() -> CollapseReport | None:
    """Collapse this process's anonymous memory into huge pages; None where unsupported."""
    if not sys.platform.startswith("linux") or os.environ.get(SWITCH_ENV, "1") == "0":
        return None
    started = time.perf_counter()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        madvise = libc.madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        madvise.restype = ctypes.c_int
        regions = _anonymous_regions(Path("/proc/self/maps").read_text())
    except (OSError, AttributeError) as exc:
        logger.debug("no huge pages for the heap: %s", exc)
        return None
    collapsed = 0
    for start, end in regions:
        # MADV_COLLAPSE alone (it does not need the THP "madvise" mode's MADV_HUGEPAGE): the
        # regions keep their flags, so later faults (a worker's heap growing) still get 4 KB
        # pages, with no compaction stall and no 2 MB rounding of a worker's private memory.
        if madvise(start, end - start, MADV_COLLAPSE) == 0:
            collapsed += 1
    try:
        huge_mb = _anon_huge_mb()
    except OSError:
        huge_mb = 0.0
    return CollapseReport(len(regions), collapsed, huge_mb, time.perf_counter() - started)
