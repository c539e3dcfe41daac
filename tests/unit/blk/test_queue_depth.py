"""Hardware tags and scheduler depth: requests wait for the device, and merge while they wait."""

import threading
import time

import pytest

from app.blk import Bio, BlockQueue, Op, QueueLimits, Request
from app.errors import InvalidInput

from .helpers import RecordingDevice, write_bio


class GatedDevice(RecordingDevice):
    """A device whose requests stay on it until the test opens the gate."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.gate = threading.Event()
        self.on_device = 0
        self.most_on_device = 0
        self.arrived = threading.Semaphore(0)

    def dispatch(self, rq: Request) -> None:
        with self.lock:
            self.on_device += 1
            self.most_on_device = max(self.most_on_device, self.on_device)
        self.arrived.release()
        self.gate.wait(5)
        super().dispatch(rq)
        with self.lock:
            self.on_device -= 1


def make_queue(device, **options) -> BlockQueue:
    return BlockQueue(device.dispatch, limits=device.limits, plug_window_us=0, **options)


def submit_in_thread(queue: BlockQueue, bio: Bio) -> threading.Thread:
    thread = threading.Thread(target=queue.submit_and_wait, args=(bio, 5))
    thread.start()
    return thread


def occupy_the_device(queue: BlockQueue, device: GatedDevice) -> threading.Thread:
    thread = submit_in_thread(queue, write_bio(1000, 8))
    assert device.arrived.acquire(timeout=5)
    return thread


def test_bios_merge_into_a_request_waiting_for_the_only_tag():
    device = GatedDevice()
    queue = make_queue(device, queue_depth=1)
    first = occupy_the_device(queue, device)
    bios = [write_bio(8 * i, 8, fill=i + 1) for i in range(6)]
    for bio in bios:
        queue.submit_bio(bio)
        queue.finish_plug()
    assert queue.stats.snapshot()["queued"] == 1
    device.gate.set()
    for bio in bios:
        bio.wait(5)
    first.join(5)
    assert device.spans() == [(Op.WRITE, 1000, 8), (Op.WRITE, 0, 48)]


def test_with_a_free_tag_each_bio_goes_to_the_device_alone():
    device = GatedDevice()
    queue = make_queue(device, queue_depth=8)
    threads = [occupy_the_device(queue, device)]
    for i in range(3):
        threads.append(submit_in_thread(queue, write_bio(8 * i, 8)))
        assert device.arrived.acquire(timeout=5)
    device.gate.set()
    for thread in threads:
        thread.join(5)
    assert sorted(device.spans()) == [
        (Op.WRITE, 0, 8),
        (Op.WRITE, 8, 8),
        (Op.WRITE, 16, 8),
        (Op.WRITE, 1000, 8),
    ]


def test_no_more_requests_on_the_device_than_it_has_tags():
    device = GatedDevice()
    queue = make_queue(device, queue_depth=3)
    threads = [submit_in_thread(queue, write_bio(16 * i, 8)) for i in range(10)]
    for _ in range(3):
        assert device.arrived.acquire(timeout=5)
    time.sleep(0.05)
    assert device.on_device == 3
    device.gate.set()
    for thread in threads:
        thread.join(5)
    assert device.most_on_device == 3
    assert len(device.requests) == 10


def test_a_submitter_waits_while_nr_requests_wait_for_a_tag():
    device = GatedDevice(limits=QueueLimits(nr_requests=2))
    queue = make_queue(device, queue_depth=1)
    first = occupy_the_device(queue, device)
    queue.submit_bio(write_bio(0, 8))
    queue.submit_bio(write_bio(100, 8))
    third = write_bio(200, 8)
    blocked = threading.Thread(target=queue.submit_bio, args=(third,))
    blocked.start()
    blocked.join(0.2)
    assert blocked.is_alive()
    assert queue.stats.snapshot()["w_bios"] == 3  # the third is not in the queue yet
    device.gate.set()
    blocked.join(5)
    assert not blocked.is_alive()
    third.wait(5)
    first.join(5)
    assert len(device.requests) == 4


def test_a_bio_that_merges_needs_no_new_request_slot():
    device = GatedDevice(limits=QueueLimits(nr_requests=1))
    queue = make_queue(device, queue_depth=1)
    first = occupy_the_device(queue, device)
    queue.submit_bio(write_bio(0, 8))
    queue.finish_plug()
    merging = write_bio(8, 8)
    queue.submit_bio(merging)  # would block if it needed a request
    device.gate.set()
    merging.wait(5)
    first.join(5)
    assert device.spans()[-1] == (Op.WRITE, 0, 16)


def test_a_held_queue_accepts_bios_beyond_nr_requests():
    device = RecordingDevice(limits=QueueLimits(nr_requests=1))
    queue = make_queue(device, queue_depth=1)
    queue.hold()
    bios = [write_bio(100 * i, 8) for i in range(4)]
    for bio in bios:
        queue.submit_bio(bio)
    queue.release()
    for bio in bios:
        bio.wait(5)
    assert len(device.requests) == 4


def test_raising_the_queue_depth_dispatches_waiting_requests():
    device = GatedDevice()
    queue = make_queue(device, queue_depth=1)
    first = occupy_the_device(queue, device)
    waiting = write_bio(100, 8)
    queue.submit_bio(waiting)
    queue.finish_plug()
    assert not device.arrived.acquire(timeout=0.05)
    raise_depth = threading.Thread(target=queue.set_queue_depth, args=(2,))
    raise_depth.start()
    assert device.arrived.acquire(timeout=5)
    assert device.on_device == 2
    device.gate.set()
    waiting.wait(5)
    first.join(5)
    raise_depth.join(5)


def test_stats_split_queue_time_from_device_time():
    device = GatedDevice()
    queue = make_queue(device, queue_depth=1)
    first = occupy_the_device(queue, device)
    waiting = write_bio(100, 8)
    queue.submit_bio(waiting)
    queue.finish_plug()
    time.sleep(0.05)
    snapshot = queue.stats.snapshot()
    assert (snapshot["in_flight"], snapshot["queued"], snapshot["on_device"]) == (2, 1, 1)
    device.gate.set()
    waiting.wait(5)
    first.join(5)
    snapshot = queue.stats.snapshot()
    assert snapshot["queued"] == snapshot["on_device"] == 0
    # The waiting write spent its first ~50 ms queued, not on the device.
    assert snapshot["w_await"] > snapshot["w_d2c"] + 20


@pytest.mark.parametrize("depth", [0, 1024])
def test_queue_depth_outside_1_to_1023_is_refused(depth):
    with pytest.raises(InvalidInput, match="queue_depth"):
        make_queue(RecordingDevice(), queue_depth=depth)


def test_nr_requests_must_be_positive():
    with pytest.raises(InvalidInput, match="nr_requests"):
        QueueLimits(nr_requests=0).validate()
