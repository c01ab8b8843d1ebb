"""The runtime's heap collapse into huge pages (model_repo/huge_pages.py)."""

from __future__ import annotations

import mmap
import os
import platform
from pathlib import Path

import pytest

from model_repo.huge_pages import HUGE_PAGE, SWITCH_ENV, _anonymous_regions, collapse_heap

MAPS = """\
55d0c0000000-55d0c0a00000 rw-p 00000000 00:00 0                          [heap]
7f0000100000-7f0000500000 rw-p 00000000 00:00 0
7f0000600000-7f0000700000 rw-p 00000000 00:00 0
7f0000800000-7f0000c00000 r--p 00000000 00:00 0
7f0001000000-7f0001400000 rw-p 00001000 08:01 42                         /usr/lib/libfoo.so
7ffd00000000-7ffd00400000 rw-p 00000000 00:00 0                          [stack]
"""


def test_only_the_huge_page_aligned_parts_of_writable_anonymous_memory() -> None:
    regions = _anonymous_regions(MAPS)
    # The heap whole; the first anonymous region trimmed to its 2 MB-aligned middle; the 1 MB
    # one, the read-only one, the library's data and the stack left out.
    assert regions == [(0x55D0C0000000, 0x55D0C0A00000), (0x7F0000200000, 0x7F0000400000)]
    assert all(start % HUGE_PAGE == 0 and end % HUGE_PAGE == 0 for start, end in regions)


def test_the_switch_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SWITCH_ENV, "0")
    assert collapse_heap() is None


def _thp_allows_madvise() -> bool:
    try:
        setting = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    major, minor = (int(x) for x in platform.release().split(".")[:2])
    return "[never]" not in setting and (major, minor) >= (6, 1)


@pytest.mark.skipif(not _thp_allows_madvise(), reason="needs THP and MADV_COLLAPSE (Linux 6.1+)")
def test_touched_anonymous_memory_ends_up_in_huge_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SWITCH_ENV, raising=False)
    size = 8 * HUGE_PAGE
    block = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        for offset in range(0, size, mmap.PAGESIZE):
            block[offset] = 1  # resident 4 KB pages, as a heap's are
        report = collapse_heap()
        assert report is not None
        assert report.collapsed >= 1 and report.collapsed <= report.regions
        # At least the block's aligned middle (6 of its 8 huge pages) is in huge pages now.
        assert report.huge_mb >= 6 * HUGE_PAGE / 2**20
        assert block[size // 2] == 1 and block[size - 1] == 0  # contents kept
    finally:
        block.close()
    assert os.environ.get(SWITCH_ENV) is None
