"""Reusable per-thread byte buffers for the data path (the role of a mempool of bio pages).

A worker that keeps its buffers reuses warm memory instead of page-faulting a
fresh one per request. Buffers start on a page boundary, like a bio's pages,
because the kernel's copy into user memory (pread, recv) is much slower into
malloc's large blocks, which start 16 bytes past a page.
"""

from __future__ import annotations

import threading

import numpy as np

PAGE = 4096
#: ``page_aligned`` carves buffers of up to SLAB_PIECE bytes out of a per-thread slab of
#: SLAB bytes (a slab is freed with its last piece).
SLAB = 1 << 20
SLAB_PIECE = 64 << 10


class _FreeList(threading.local):
    def __init__(self) -> None:
        self.buffers: list[memoryview] = []
        self.slab = memoryview(b"")
        self.used = SLAB


_free = _FreeList()


def _aligned(size: int) -> memoryview:
    raw = np.empty(size + PAGE, dtype=np.uint8)
    start = -raw.ctypes.data % PAGE
    return raw.data[start : start + size]


def page_aligned(size: int) -> memoryview:
    """An uninitialized buffer of ``size`` bytes starting on a page boundary.

    A small one is the next pages of this thread's slab: asking numpy where a fresh array
    starts (``ndarray.ctypes``) costs more than the system call that fills a 4 KiB read.
    Memoryviews, not arrays: slicing an array and viewing it costs more than that too.
    """
    if size > SLAB_PIECE:
        return _aligned(size)
    local = _free
    used = local.used
    end = used + size
    if end > SLAB:
        local.slab = _aligned(SLAB)
        used, end = 0, size
    local.used = (end + PAGE - 1) & -PAGE
    return local.slab[used:end]


def take(size: int) -> memoryview:
    """A page-aligned buffer of at least ``size`` bytes off this thread's free list, to be
    handed back with ``give``: ``borrow`` without a ``with`` block, for once-per-request use."""
    free = _free.buffers
    buffer = free.pop() if free else _aligned(0)
    if len(buffer) < size:
        buffer = _aligned(size)
    return buffer


def give(buffer: memoryview) -> None:
    """Return a buffer ``take`` gave to this thread's free list."""
    _free.buffers.append(buffer)


def borrow(size: int) -> _Borrowed:
    """An uninitialized writable buffer of ``size`` bytes for the ``with`` block.

    A free list, not one buffer per thread: borrows nest (an unaligned write gathered
    into a borrowed buffer borrows again for its read-modify-write), and each gets its own.
    """
    return _Borrowed(size)


class _Borrowed:
    """A class, not a generator context manager: every write borrows one or two."""

    __slots__ = ("_buffer", "_size")

    def __init__(self, size: int) -> None:
        self._size = size

    def __enter__(self) -> memoryview:
        buffer = self._buffer = take(self._size)
        return buffer[: self._size]

    def __exit__(self, *_: object) -> None:
        give(self._buffer)
