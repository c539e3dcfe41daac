"""Reusable per-thread byte buffers for the data path (the role of a mempool of bio pages).

A MiB buffer allocated per request costs a pass of page faults or zeroing, and
lands cold in the cache; a worker that keeps its buffers reuses warm memory.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import numpy.typing as npt


class _FreeList(threading.local):
    def __init__(self) -> None:
        self.buffers: list[npt.NDArray[np.uint8]] = []


_free = _FreeList()


@contextmanager
def borrow(size: int) -> Iterator[memoryview]:
    """An uninitialized writable buffer of ``size`` bytes for the ``with`` block.

    A free list, not one buffer per thread: borrows nest (a crypt volume stacked on
    another maps the lower read on the same thread), and each gets its own.
    """
    free = _free.buffers
    buffer = free.pop() if free else np.empty(0, dtype=np.uint8)
    if len(buffer) < size:
        buffer = np.empty(size, dtype=np.uint8)
    try:
        yield buffer.data[:size]
    finally:
        free.append(buffer)
