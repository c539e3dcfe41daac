"""Per-thread reusable buffers: nested borrows never share memory, later ones reuse it."""

from __future__ import annotations

import numpy as np

from app.blk import mempool


def address(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


def test_nested_borrows_get_distinct_buffers():
    with mempool.borrow(4096) as outer, mempool.borrow(4096) as inner:
        assert address(outer) != address(inner)
        outer[:] = b"o" * 4096
        inner[:] = b"i" * 4096
        assert bytes(outer) == b"o" * 4096


def test_a_later_borrow_reuses_the_returned_buffer():
    with mempool.borrow(8192) as first:
        kept = address(first)
    with mempool.borrow(4096) as second:
        assert len(second) == 4096
        assert address(second) == kept
