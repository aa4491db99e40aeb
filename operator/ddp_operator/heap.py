"""Hands the operator's memory back to the system once its caches have shrunk a lot.

A gang of 10,000 pods fills the pod cache with as many slim copies, and the watch and the API calls
that went with them with short-lived buffers; once the job is gone, Python frees the objects, but
glibc's allocator keeps the pages in its heaps (one per thread that allocated, up to eight per core)
and the process's RSS stays near its peak. A full collection and malloc_trim(0) give them back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

# Fewer objects gone than this is not worth a full collection's pause (tens of milliseconds).
RELEASE_AFTER = 1000


@dataclass
class Shrinkage:
    """The most objects a cache held since memory was last released."""

    peak: int = 0

    def saw(self, count: int) -> bool:
        """Whether the cache, down to `count` objects, has lost at least RELEASE_AFTER and half of its
        peak since the last release: then memory is worth releasing (and the peak starts again from here)."""
        self.peak = max(self.peak, count)
        dropped = self.peak - count
        if dropped < RELEASE_AFTER or 2 * dropped < self.peak:
            return False
        self.peak = count
        return True


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim; None where the C library has none (musl)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


MALLOC_TRIM = _malloc_trim()


def release_memory() -> None:
    """Collects every generation, then hands free pages of the C heaps back to the system."""
    collected = gc.collect()
    if MALLOC_TRIM is not None:
        MALLOC_TRIM(0)
    log.debug("memory released (%d objects collected)", collected)
