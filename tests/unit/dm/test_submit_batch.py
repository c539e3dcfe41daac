"""``Volume.submit_batch``: many whole-block I/Os under one plug, errors per I/O."""

from __future__ import annotations

import threading
import time

from app.dm.rangelock import RangeLock
from app.engine.registry import EngineRegistry
from app.errors import RangeNotSatisfiable, Unavailable
from app.io.ops import Io
from app.storage.memory import MemoryStore
from tests.support.volumes import SECTORS, make_volume


def test_sequential_writes_of_one_batch_merge_and_read_back() -> None:
    volume = make_volume(MemoryStore(SECTORS * 512), plug_window_us=0)
    writes = [Io.write(i * 4096, memoryview(bytes([i]) * 4096)) for i in range(16)]
    volume.submit_batch(writes)
    assert [io.error for io in writes] == [None] * 16
    stats = volume.stats.snapshot()
    assert stats["w_bios"] == 16
    assert stats["w_ios"] == 1  # all sixteen were plugged before any was dispatched
    buffers = [memoryview(bytearray(4096)) for _ in range(16)]
    volume.submit_batch([Io.read(i * 4096, buffers[i]) for i in range(16)])
    assert [bytes(buffer) for buffer in buffers] == [bytes([i]) * 4096 for i in range(16)]


def test_one_bad_io_fails_alone() -> None:
    volume = make_volume(MemoryStore(SECTORS * 512))
    good = Io.write(0, memoryview(b"\x01" * 512))
    beyond = Io.write(SECTORS * 512, memoryview(b"\x02" * 512))
    volume.submit_batch([good, beyond])
    assert good.error is None
    assert isinstance(beyond.error, RangeNotSatisfiable)
    assert volume.read(0, 512) == b"\x01" * 512


def test_a_batch_on_a_volume_suspended_too_long_fails_every_io() -> None:
    volume = make_volume(MemoryStore(SECTORS * 512))
    volume.suspend()
    ios = [Io.read(0, memoryview(bytearray(512))) for _ in range(3)]
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


def test_a_batch_started_without_waiting_is_refused_on_a_suspended_volume() -> None:
    volume = make_volume(MemoryStore(SECTORS * 512))
    volume.suspend()
    io = Io.read(0, memoryview(bytearray(512)))
    assert volume.start_batch([io], wait=False) is None
    assert (io.error, volume.in_flight) == (None, 0)


def test_a_batch_started_without_waiting_is_refused_behind_an_exclusive_range() -> None:
    volume = make_volume(MemoryStore(SECTORS * 512))
    io = Io.write(0, memoryview(bytes(4096)))
    before = volume.versions.snapshot()
    with volume._ranges.hold(0, 512, exclusive=True):
        assert volume.start_batch([io], wait=False) is None
    assert volume.in_flight == 0
    assert volume.versions.snapshot() == before  # no write was counted


def test_a_started_batch_completes_at_once_and_holds_the_volume_until_finished() -> None:
    volume = make_volume(MemoryStore(SECTORS * 512), plug_window_us=0)
    io = Io.write(0, memoryview(b"\x05" * 4096))
    started = volume.start_batch([io], wait=False)
    assert started is not None
    assert started.done()  # dispatched on this thread
    assert volume.in_flight == 1
    started.finish()
    assert (io.error, volume.in_flight) == (None, 0)
    assert volume.read(0, 4096) == b"\x05" * 4096


def test_a_started_batch_on_a_held_queue_finishes_after_release() -> None:
    volume = make_volume(MemoryStore(SECTORS * 512))
    io = Io.write(0, memoryview(b"\x06" * 4096))
    volume.queue.hold()  # what a noflush suspend does after admission
    started = volume.start_batch([io], wait=False)
    assert started is not None
    assert not started.done()
    finisher = threading.Thread(target=started.finish)
    finisher.start()
    volume.queue.release()
    finisher.join(5)
    assert io.error is None
    assert volume.read(0, 4096) == b"\x06" * 4096


def test_a_volume_on_a_memory_store_with_the_software_engine_serves_promptly() -> None:
    assert make_volume(MemoryStore(SECTORS * 512)).serves_promptly()


def test_a_paced_engine_is_not_prompt() -> None:
    volume = make_volume(MemoryStore(SECTORS * 512))
    volume.retune(volume.tuning, EngineRegistry(pacing=1.0).engine("omap-aes-am335x"))
    assert not volume.serves_promptly()


class _RemoteStore(MemoryStore):
    """A store whose I/O waits on the network, as RBD's does."""

    prompt = False


def test_a_volume_on_a_remote_store_overlaps_its_batches() -> None:
    volume = make_volume(_RemoteStore(SECTORS * 512))
    assert volume.overlaps_batches()
    assert volume.queue._overlapped
    volume.submit_batch([Io.write(0, memoryview(b"\x07" * 4096))])
    assert volume.read(0, 4096) == b"\x07" * 4096


def test_a_volume_on_a_local_store_does_not_overlap_its_batches() -> None:
    volume = make_volume(MemoryStore(SECTORS * 512))
    volume.retune(volume.tuning, EngineRegistry(pacing=1.0).engine("omap-aes-am335x"))
    assert not volume.overlaps_batches()
    assert not volume.queue._overlapped
