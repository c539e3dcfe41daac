"""The process's allocator: glibc's thresholds as serving sets them, and handing freed
memory back to the system after a burst of clients. libc is looked up once
(``find_library`` runs a subprocess), not on the event loop each time."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from functools import cache

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 64 << 20
TRIM_THRESHOLD = 256 << 20
"""glibc's thresholds as ``reqcrypt serve`` sets them (``tune_malloc``)."""
TRIM_THRESHOLD_LOW = 128 << 10
"""glibc's default M_TRIM_THRESHOLD."""
TRIM_AFTER = 32 << 20
"""Freed memory worth handing back to the system (``trim_after``)."""


@cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    libc = None if name is None else ctypes.CDLL(name)
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def tune_malloc() -> None:
    """Keep MiB-sized I/O buffers on the heap instead of fresh page-faulted mmaps.

    glibc maps every allocation above 128 KiB anew and unmaps it on free; each
    1 MiB body then costs ~0.9 ms of page faults (measured on a 2-core EPYC; tuning the
    thresholds tripled 1 MiB throughput there). What the heap then keeps after a burst is
    handed back by ``trim_after``.
    """
    libc = _libc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)


def trim_after(peak: int) -> None:
    """Once clients that made the process hold ``peak`` bytes are gone, hand the heap's
    free pages back to the system (glibc's ``malloc_trim``, every arena), off the loop."""
    libc = _libc()
    if peak >= TRIM_AFTER and libc is not None:
        asyncio.get_running_loop().run_in_executor(None, _trim, libc)


def _trim(libc: ctypes.CDLL) -> None:
    """``malloc_trim`` under a low trim threshold: a thread's arena gives back its top only
    past the threshold, even when asked (glibc's ``heap_trim``), and serving sets it high."""
    libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_LOW)
    try:
        libc.malloc_trim(0)
    finally:
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
