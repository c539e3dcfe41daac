"""Reusable per-thread byte buffers for the data path (the role of a mempool of bio pages).

A worker that keeps its buffers reuses warm memory instead of page-faulting a
fresh one per request. Buffers start on a page boundary, like a bio's pages,
because the kernel's copy into user memory (pread, recv) is much slower into
malloc's large blocks, which start 16 bytes past a page.
"""

from __future__ import annotations

import threading
from types import TracebackType

import numpy as np
import numpy.typing as npt


class _FreeList(threading.local):
    def __init__(self) -> None:
        self.buffers: list[npt.NDArray[np.uint8]] = []


_free = _FreeList()
PAGE = 4096


def page_aligned(size: int) -> npt.NDArray[np.uint8]:
    """An uninitialized byte array of ``size`` bytes starting on a page boundary."""
    raw = np.empty(size + PAGE, dtype=np.uint8)
    start = -raw.ctypes.data % PAGE
    return raw[start : start + size]


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
        free = _free.buffers
        buffer = free.pop() if free else page_aligned(0)
        if len(buffer) < self._size:
            buffer = page_aligned(self._size)
        self._buffer = buffer
        return buffer.data[: self._size]

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        _free.buffers.append(self._buffer)
