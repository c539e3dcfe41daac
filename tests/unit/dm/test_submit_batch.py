"""``Volume.submit_batch``: many whole-block I/Os under one plug, errors per I/O."""

from __future__ import annotations

import threading
import time

from app.dm.datapath import BatchIo
from app.dm.rangelock import RangeLock
from app.errors import RangeNotSatisfiable, Unavailable
from app.storage.memory import MemoryStore
from app.vocab import Op
from tests.unit.dm.test_volume import SECTORS, make_volume


def test_sequential_writes_of_one_batch_merge_and_read_back() -> None:
    volume = make_volume(MemoryStore(SECTORS * 512), plug_window_us=0)
    writes = [BatchIo(Op.WRITE, i * 4096, memoryview(bytes([i]) * 4096)) for i in range(16)]
    volume.submit_batch(writes)
    assert [io.error for io in writes] == [None] * 16
    stats = volume.stats.snapshot()
    assert stats["w_bios"] == 16
    assert stats["w_ios"] == 1  # all sixteen were plugged before any was dispatched
    buffers = [memoryview(bytearray(4096)) for _ in range(16)]
    volume.submit_batch([BatchIo(Op.READ, i * 4096, buffers[i]) for i in range(16)])
    assert [bytes(buffer) for buffer in buffers] == [bytes([i]) * 4096 for i in range(16)]


def test_one_bad_io_fails_alone() -> None:
    volume = make_volume(MemoryStore(SECTORS * 512))
    good = BatchIo(Op.WRITE, 0, memoryview(b"\x01" * 512))
    beyond = BatchIo(Op.WRITE, SECTORS * 512, memoryview(b"\x02" * 512))
    volume.submit_batch([good, beyond])
    assert good.error is None
    assert isinstance(beyond.error, RangeNotSatisfiable)
    assert volume.read(0, 512) == b"\x01" * 512


def test_a_batch_on_a_volume_suspended_too_long_fails_every_io() -> None:
    volume = make_volume(MemoryStore(SECTORS * 512))
    volume.suspend()
    ios = [BatchIo(Op.READ, 0, memoryview(bytearray(512))) for _ in range(3)]
    volume.submit_batch(ios)
    assert all(isinstance(io.error, Unavailable) for io in ios)


def test_shared_ranges_wait_for_an_overlapping_exclusive_holder() -> None:
    lock = RangeLock()
    entered = threading.Event()
    with lock.hold(4096, 8192, exclusive=True):

        def batch() -> None:
            with lock.hold_shared([(0, 512), (6000, 7000)]):
                entered.set()

        thread = threading.Thread(target=batch)
        thread.start()
        time.sleep(0.05)
        assert not entered.is_set()
    thread.join(2)
    assert entered.is_set()
    with lock.hold_shared([(0, 512), (100, 600)]), lock.hold(1000, 2000, exclusive=True):
        pass
