"""Giving heap memory freed by a bulk step back to the operating system."""
from __future__ import annotations

import ctypes
import sys
from typing import Any


def _libc_malloc_trim() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc; absent elsewhere (musl)
    except (AttributeError, OSError):
        return None


_malloc_trim = _libc_malloc_trim()


def release_freed_memory() -> None:
    """Give heap pages freed by a bulk step back to the OS (glibc ``malloc_trim``).

    glibc keeps freed heap memory below the last live allocation. Measured at 100k
    memories: a view rebuild (which decodes every row, ~150 MiB of vector bytes alone, and
    frees it) left ~300 MiB more resident without it (``malloc_trim`` took ~16 ms); the
    merges of a one-by-one-built index (temporaries of ~13 MiB each) left ~80 MiB more.
    Used by the BM25 index after merges and compaction, and by a memory view after a
    rebuild (node/memory/view_feed.py). A no-op where there is no glibc.
    """
    if _malloc_trim is not None:
        _malloc_trim(0)
