"""Reusable per-thread byte buffers for the data path (the role of a mempool of bio pages).

A worker that keeps its buffers reuses warm memory instead of page-faulting a
fresh one per request. Buffers start on a page boundary, like a bio's pages,
because the kernel's copy into user memory (pread, recv) is much slower into
malloc's large blocks, which start 16 bytes past a page.

Slabs and large buffers are anonymous mappings, not malloc's: a buffer freed goes back
to a small warm pool (``MAPPED_POOL`` bytes) or to the system at once, so memory that a
burst of clients made the process hold comes back when they go, whatever malloc's
thresholds (raised for speed by ``reqcrypt serve``) would keep.
"""

from __future__ import annotations

import mmap
import threading
import weakref

import numpy as np

PAGE = 4096
#: ``page_aligned`` carves buffers of up to SLAB_PIECE bytes out of a per-thread slab of
#: SLAB bytes (a slab is freed with its last piece).
SLAB = 1 << 20
SLAB_PIECE = 64 << 10
#: Buffers a thread's free list keeps: enough for nested borrows; past it, a burst of
#: concurrent requests' buffers are freed rather than kept for ever.
FREE_LIST = 8
#: Freed mappings kept warm for the next buffer of their size; the rest are unmapped.
MAPPED_POOL = 8 << 20


class _FreeList(threading.local):
    def __init__(self) -> None:
        self.buffers: list[memoryview] = []
        self.slab = memoryview(b"")
        self.used = SLAB


_free = _FreeList()


class _Mapped:
    """Freed mappings by size, for any thread (a buffer is freed where its last view goes)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.free: dict[int, list[mmap.mmap]] = {}
        self.pooled = 0


_mapped = _Mapped()


def _aligned(size: int) -> memoryview:
    """A mapping of ``size`` bytes (page-aligned by nature), through an ndarray: its
    finalizer hands the mapping back when the last view of it goes."""
    length = max(size, 1)
    with _mapped.lock:
        stack = _mapped.free.get(length)
        mapping = stack.pop() if stack else None
        if mapping is not None:
            _mapped.pooled -= length
    if mapping is None:
        mapping = mmap.mmap(-1, length)
    array = np.frombuffer(mapping, dtype=np.uint8)
    weakref.finalize(array, _recycle, mapping)
    return array.data[:size]


def _recycle(mapping: mmap.mmap) -> None:
    length = len(mapping)
    with _mapped.lock:
        if _mapped.pooled + length <= MAPPED_POOL:
            _mapped.free.setdefault(length, []).append(mapping)
            _mapped.pooled += length


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
    """Return a buffer ``take`` gave to this thread's free list (or drop it, when full)."""
    free = _free.buffers
    if len(free) < FREE_LIST:
        free.append(buffer)


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
