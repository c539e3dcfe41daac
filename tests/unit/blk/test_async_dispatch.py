"""A dispatch that returns a wait (asynchronous device I/O): a batch goes to the device
whole before the first wait, and ordering and errors stay per request."""

import pytest

from app.blk import Bio, BlockQueue, Op, QueueLimits, Request
from app.errors import TargetIOError

from .helpers import SECTOR, RecordingDevice, read_bio, write_bio


class AsyncDevice(RecordingDevice):
    """Starts each request at dispatch and performs it in its wait; logs both."""

    def __init__(self, failing: frozenset[int] = frozenset(), **options) -> None:
        super().__init__(**options)
        self.failing = failing
        self.events: list[tuple[str, Op, int]] = []
        self.started_at_first_wait: int | None = None

    def _log(self, what: str, rq: Request) -> None:
        with self.lock:
            self.events.append((what, rq.op, rq.sector))

    def dispatch(self, rq: Request):  # type: ignore[override]
        self._log("start", rq)

        def wait() -> None:
            with self.lock:
                if self.started_at_first_wait is None:
                    self.started_at_first_wait = sum(e[0] == "start" for e in self.events)
            if rq.sector in self.failing:
                raise TargetIOError(f"sector {rq.sector} failed")
            RecordingDevice.dispatch(self, rq)
            self._log("done", rq)

        return wait


def make_queue(device: AsyncDevice) -> BlockQueue:
    return BlockQueue(device.dispatch, limits=QueueLimits(), plug_window_us=0)


def submit_and_wait(queue: BlockQueue, bios: list[Bio]) -> None:
    queue.submit_bios(bios)
    for bio in bios:
        bio.wait(5)


def scattered_reads(count: int) -> list[Bio]:
    """4 KiB reads with gaps between them: one request each."""
    return [read_bio(16 * index, 8) for index in range(count)]


def test_a_batch_is_all_on_the_device_before_its_first_wait():
    device = AsyncDevice()
    bios = scattered_reads(16)
    submit_and_wait(make_queue(device), bios)
    assert device.started_at_first_wait == 16


def test_a_failed_wait_fails_only_its_bios():
    device = AsyncDevice(failing=frozenset({32}))
    device.data[:] = b"d" * len(device.data)
    bios = scattered_reads(4)
    make_queue(device).submit_bios(bios)
    with pytest.raises(TargetIOError, match="sector 32 failed"):
        bios[2].wait(5)
    for bio in (bios[0], bios[1], bios[3]):
        bio.wait(5)
        assert bytes(bio.segments[0]) == b"d" * 4096


def test_a_failed_start_keeps_no_other_request_off_the_device():
    class FailingStart(AsyncDevice):
        def dispatch(self, rq: Request):  # type: ignore[override]
            if rq.sector == 0:
                raise TargetIOError("refused")
            return super().dispatch(rq)

    device = FailingStart()
    bios = [write_bio(0, 8, fill=1), write_bio(16, 8, fill=2)]
    make_queue(device).submit_bios(bios)
    with pytest.raises(TargetIOError, match="refused"):
        bios[0].wait(5)
    bios[1].wait(5)
    assert device.data[16 * SECTOR : 24 * SECTOR] == b"\x02" * 4096


def test_an_overlapping_write_starts_only_after_the_earlier_one_is_done():
    device = AsyncDevice()
    bios = [write_bio(0, 8, fill=1), write_bio(0, 8, fill=2)]
    submit_and_wait(make_queue(device), bios)
    assert device.events == [
        ("start", Op.WRITE, 0),
        ("done", Op.WRITE, 0),
        ("start", Op.WRITE, 0),
        ("done", Op.WRITE, 0),
    ]
    assert device.data[: 8 * SECTOR] == b"\x02" * 4096


def test_a_flush_starts_only_after_every_earlier_write_is_done():
    device = AsyncDevice()
    writes = [write_bio(16 * index, 8, fill=index + 1) for index in range(4)]
    flush = Bio(Op.FLUSH, 0, 0)
    make_queue(device).submit_bios([*writes, flush])
    flush.wait(5)
    flush_started = device.events.index(("start", Op.FLUSH, 0))
    writes_done = [device.events.index(("done", Op.WRITE, bio.sector)) for bio in writes]
    assert max(writes_done) < flush_started


def big_reads(count: int) -> list[Bio]:
    """128 KiB reads (a dispatch batch each) with gaps between them."""
    return [read_bio(512 * index, 256) for index in range(count)]


def starts_and_dones(device: AsyncDevice) -> list[tuple[str, int]]:
    return [(what, sector) for what, _, sector in device.events]


def test_a_queue_waits_for_its_batch_before_it_starts_the_next():
    device = AsyncDevice()
    bios = big_reads(3)
    submit_and_wait(make_queue(device), bios)
    assert starts_and_dones(device) == [
        ("start", 0), ("done", 0), ("start", 512), ("done", 512), ("start", 1024), ("done", 1024)
    ]  # fmt: skip


def test_an_overlapped_queue_starts_every_ready_batch_before_it_waits():
    device = AsyncDevice()
    queue = make_queue(device)
    queue.set_overlapped(True)
    bios = big_reads(3)
    submit_and_wait(queue, bios)
    assert starts_and_dones(device) == [
        ("start", 0), ("start", 512), ("start", 1024), ("done", 0), ("done", 512), ("done", 1024)
    ]  # fmt: skip
    assert queue.in_flight == 0


def test_an_overlapped_queue_keeps_to_its_tags():
    device = AsyncDevice()
    queue = BlockQueue(device.dispatch, limits=QueueLimits(), plug_window_us=0, queue_depth=2)
    queue.set_overlapped(True)
    bios = big_reads(3)
    submit_and_wait(queue, bios)
    assert starts_and_dones(device) == [
        ("start", 0), ("start", 512), ("done", 0), ("start", 1024), ("done", 512), ("done", 1024)
    ]  # fmt: skip


def test_an_overlapped_queue_starts_an_overlapping_write_only_after_the_earlier_one():
    device = AsyncDevice()
    queue = make_queue(device)
    queue.set_overlapped(True)
    bios = [write_bio(0, 256, fill=1), write_bio(0, 256, fill=2), write_bio(512, 256, fill=3)]
    submit_and_wait(queue, bios)
    events = starts_and_dones(device)
    assert events.index(("done", 0)) < len(events) - 1 - events[::-1].index(("start", 0))
    assert device.data[: 256 * SECTOR] == b"\x02" * 256 * SECTOR
    assert device.data[512 * SECTOR : 768 * SECTOR] == b"\x03" * 256 * SECTOR
