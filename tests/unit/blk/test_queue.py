import threading

import pytest

from app.blk import (
    BLK_MAX_REQUEST_COUNT,
    Bio,
    BlockQueue,
    Op,
    QueueLimits,
)
from app.errors import InvalidInput, TargetIOError

from .helpers import SECTOR, RecordingDevice, read_bio, write_bio

LONG_WINDOW_US = 10_000_000  # plug flushes only by thresholds or explicitly


def make_queue(device=None, *, window=LONG_WINDOW_US, **options):
    device = device or RecordingDevice(limits=options.get("limits"))
    options.setdefault("limits", device.limits)
    return device, BlockQueue(device.dispatch, plug_window_us=window, **options)


def submit_all(queue, bios):
    for bio in bios:
        queue.submit_bio(bio)
    return bios


def wait_all(bios):
    for bio in bios:
        bio.wait(5)


def test_contiguous_bios_merge_into_one_request():
    device, queue = make_queue()
    bios = submit_all(queue, [write_bio(8 * i, 8, fill=i) for i in range(8)])
    assert device.requests == []  # still plugged
    queue.finish_plug()
    wait_all(bios)
    assert device.spans() == [(Op.WRITE, 0, 64)]
    assert bytes(device.data[8 * SECTOR * 3 : 8 * SECTOR * 3 + 1]) == b"\x03"


def test_front_merge_through_the_queue():
    device, queue = make_queue()
    bios = submit_all(queue, [write_bio(8, 8), write_bio(0, 8)])
    queue.finish_plug()
    wait_all(bios)
    assert device.spans() == [(Op.WRITE, 0, 16)]
    assert queue.stats.snapshot()["front_merges"] == 1


def test_bio_filling_the_gap_merges_two_requests():
    device, queue = make_queue()
    bios = submit_all(queue, [write_bio(0, 8), write_bio(16, 8), write_bio(8, 8)])
    queue.finish_plug()
    wait_all(bios)
    assert device.spans() == [(Op.WRITE, 0, 24)]
    assert [bio.sector for bio in device.requests[0].bios] == [0, 8, 16]
    assert queue.stats.snapshot()["request_merges"] == 1


def test_nomerges_1_allows_only_the_last_request_merge():
    device, queue = make_queue(limits=QueueLimits(nomerges=1))
    bios = submit_all(
        queue, [write_bio(0, 8), write_bio(100, 8), write_bio(8, 8), write_bio(16, 8)]
    )
    queue.finish_plug()
    wait_all(bios)
    # 8 joins neither (its neighbour is not the last request); 16 joins 8, the last.
    assert device.spans() == [(Op.WRITE, 0, 8), (Op.WRITE, 100, 8), (Op.WRITE, 8, 16)]


def test_nomerges_2_disables_all_merges():
    device, queue = make_queue(limits=QueueLimits(nomerges=2))
    bios = submit_all(queue, [write_bio(0, 8), write_bio(8, 8)])
    queue.finish_plug()
    wait_all(bios)
    assert len(device.requests) == 2


def test_reads_and_writes_do_not_merge():
    device, queue = make_queue()
    bios = submit_all(queue, [write_bio(0, 8), read_bio(8, 8)])
    queue.finish_plug()
    wait_all(bios)
    assert len(device.requests) == 2


def test_plug_flushes_before_the_33rd_request():
    device, queue = make_queue()
    bios = submit_all(queue, [write_bio(16 * i, 8) for i in range(BLK_MAX_REQUEST_COUNT)])
    assert device.requests == []
    bios += submit_all(queue, [write_bio(16 * 100, 8)])
    assert len(device.requests) == BLK_MAX_REQUEST_COUNT  # flushed on this thread
    queue.finish_plug()
    wait_all(bios)


def test_plug_flushes_when_last_request_reaches_128k():
    device, queue = make_queue()
    bios = submit_all(queue, [write_bio(8 * i, 8) for i in range(31)])  # 124 KiB
    bios += submit_all(queue, [write_bio(2000, 8)])
    assert device.requests == []
    queue.finish_plug()
    wait_all(bios)
    device.requests.clear()
    bios = submit_all(queue, [write_bio(8 * i, 8) for i in range(32)])  # 128 KiB
    assert device.requests == []
    bios += submit_all(queue, [write_bio(4000, 8)])
    assert device.spans() == [(Op.WRITE, 0, 256)]
    queue.finish_plug()
    wait_all(bios)


def test_waiter_flushes_the_plug_after_the_window():
    device, queue = make_queue(window=200)
    bio = write_bio(0, 8)
    queue.submit_and_wait(bio, timeout=5)
    assert device.spans() == [(Op.WRITE, 0, 8)]


def test_bios_are_split_to_max_sectors_and_boundaries():
    limits = QueueLimits(max_sectors_kb=4)
    device = RecordingDevice(limits=limits, boundaries=(12,))
    _, queue = make_queue(device, boundaries=(12,), window=0)
    bio = write_bio(0, 24, fill=7)
    queue.submit_and_wait(bio, timeout=5)
    assert sorted(device.spans(), key=lambda span: span[1]) == [
        (Op.WRITE, 0, 8),
        (Op.WRITE, 8, 4),
        (Op.WRITE, 12, 8),
        (Op.WRITE, 20, 4),
    ]
    assert device.violations == []
    assert device.data[: 24 * SECTOR] == bytes([7]) * 24 * SECTOR


def test_bios_are_split_to_max_segments():
    limits = QueueLimits(max_segments=2)
    device, queue = make_queue(RecordingDevice(limits=limits), window=0)
    segments = [memoryview(bytes([i]) * SECTOR) for i in range(5)]
    queue.submit_and_wait(Bio(Op.WRITE, 0, 5, segments), timeout=5)
    assert device.violations == []
    assert [rq.nr_phys_segments for rq in device.requests] == [2, 2, 1]


@pytest.mark.parametrize(
    "bio",
    [
        Bio(Op.WRITE, 0, 8, [memoryview(bytes(100))]),
        Bio(Op.WRITE, 1, 8, [memoryview(bytes(4096))]),
        Bio(Op.READ, 0, 0),
        Bio(Op.DISCARD, 0, 8, [memoryview(bytes(4096))]),
        Bio(Op.FLUSH, 0, 8),
    ],
)
def test_malformed_bios_are_refused(bio):
    _, queue = make_queue(limits=QueueLimits(logical_block_size=4096))
    with pytest.raises(InvalidInput):
        queue.submit_bio(bio)


def test_bio_mode_dispatches_each_bio_at_once():
    device, queue = make_queue(dispatch_mode="bio")
    bios = submit_all(queue, [write_bio(0, 8), write_bio(8, 8)])
    assert device.spans() == [(Op.WRITE, 0, 8), (Op.WRITE, 8, 8)]
    wait_all(bios)


def test_switching_to_bio_mode_flushes_the_plug():
    device, queue = make_queue()
    bio = queue.submit_bio(write_bio(0, 8)) or None
    queue.set_dispatch_mode("bio")
    assert device.spans() == [(Op.WRITE, 0, 8)]
    queue.submit_bio(write_bio(8, 8))
    assert len(device.requests) == 2
    assert bio is None


def test_dispatch_error_fails_every_merged_bio():
    def dispatch(request):
        raise TargetIOError("device gone")

    queue = BlockQueue(dispatch, limits=QueueLimits(), plug_window_us=0)
    bios = submit_all(queue, [write_bio(0, 8), write_bio(8, 8)])
    for bio in bios:
        with pytest.raises(TargetIOError):
            bio.wait(5)


@pytest.mark.parametrize("flag", ["fua", "preflush"])
def test_fua_and_preflush_are_merge_barriers(flag):
    device, queue = make_queue()
    queue.hold()
    bios = submit_all(queue, [write_bio(0, 8), write_bio(100, 8, **{flag: True}), write_bio(8, 8)])
    queue.release()
    wait_all(bios)
    assert sorted(device.spans(), key=lambda span: span[1]) == [
        (Op.WRITE, 0, 8),
        (Op.WRITE, 8, 8),
        (Op.WRITE, 100, 8),
    ]


def test_without_barrier_the_same_bios_merge():
    device, queue = make_queue()
    queue.hold()
    bios = submit_all(queue, [write_bio(0, 8), write_bio(100, 8), write_bio(8, 8)])
    queue.release()
    queue.drain(5)
    wait_all(bios)
    assert sorted(device.spans(), key=lambda span: span[1]) == [
        (Op.WRITE, 0, 16),
        (Op.WRITE, 100, 8),
    ]


def test_writes_after_a_flush_do_not_join_earlier_requests():
    device, queue = make_queue()
    queue.hold()
    first, flush, later = write_bio(0, 8), Bio(Op.FLUSH, 0, 0), write_bio(8, 8)
    submit_all(queue, [first, flush, later])
    queue.release()
    queue.drain(5)
    assert device.spans()[:2] == [(Op.WRITE, 0, 8), (Op.FLUSH, 0, 0)]
    assert len(device.requests) == 3


@pytest.mark.parametrize("elevator", ["none", "mq-deadline"])
def test_overlapping_writes_are_applied_in_submission_order(elevator):
    device, queue = make_queue(elevator=elevator)
    queue.hold()
    older = write_bio(8, 8, fill=1)
    newer = write_bio(0, 12, fill=2)  # lower sector: mq-deadline would sort it first
    read = read_bio(0, 16)
    submit_all(queue, [older, newer, read])
    queue.release()
    wait_all([older, newer, read])
    assert [rq.bios[0] for rq in device.requests] == [older, newer, read]
    assert bytes(read.segments[0]) == bytes([2]) * 12 * SECTOR + bytes([1]) * 4 * SECTOR


def test_flush_waits_for_earlier_writes_in_flight():
    gate, started = threading.Event(), threading.Event()
    device = RecordingDevice()

    def dispatch(request):
        if request.op is Op.WRITE:
            started.set()
            assert gate.wait(5)
        device.dispatch(request)

    queue = BlockQueue(dispatch, limits=QueueLimits(), dispatch_mode="bio")
    write = write_bio(0, 8)
    writer = threading.Thread(target=queue.submit_and_wait, args=(write, 5))
    writer.start()
    assert started.wait(5)
    flush = Bio(Op.FLUSH, 0, 0)
    queue.submit_bio(flush)  # not ready: returns without dispatching
    assert not flush.done.is_set()
    overlapping = write_bio(4, 8, fill=9)
    queue.submit_bio(overlapping)
    assert device.requests == []
    gate.set()
    writer.join(5)
    flush.wait(5)
    overlapping.wait(5)
    assert [rq.bios[0] for rq in device.requests][:2] == [write, flush]
    assert device.data[4 * SECTOR] == 9


def test_hold_queues_and_release_dispatches():
    device, queue = make_queue(dispatch_mode="bio")
    queue.hold()
    bio = write_bio(0, 8)
    queue.submit_bio(bio)
    assert device.requests == []
    assert queue.in_flight == 1
    assert queue.drain(0.01)  # held: nothing in dispatch to wait for
    queue.release()
    bio.wait(5)
    assert queue.in_flight == 0


def test_drain_flushes_the_plug_and_waits():
    _device, queue = make_queue()
    bio = write_bio(0, 8)
    queue.submit_bio(bio)
    assert queue.drain(5)
    assert bio.done.is_set()
    assert queue.in_flight == 0


def test_drain_times_out_while_dispatch_is_stuck():
    gate = threading.Event()

    def dispatch(request):
        gate.wait(5)

    queue = BlockQueue(dispatch, limits=QueueLimits(), dispatch_mode="bio")
    thread = threading.Thread(target=queue.submit_bio, args=(write_bio(0, 8),))
    thread.start()
    assert not queue.drain(0.02)
    gate.set()
    thread.join(5)
    assert queue.drain(5)


def test_set_elevator_keeps_queued_requests():
    device, queue = make_queue(dispatch_mode="bio")
    queue.hold()
    bios = submit_all(queue, [write_bio(100, 8), write_bio(0, 8)])
    queue.set_elevator("mq-deadline")
    assert queue.elevator == "mq-deadline"
    queue.release()
    wait_all(bios)
    assert [span[1] for span in device.spans()] == [0, 100]


def test_set_limits_validates():
    _, queue = make_queue()
    with pytest.raises(InvalidInput):
        queue.set_limits(QueueLimits(max_segments=0))
    queue.set_limits(QueueLimits(max_sectors_kb=4))
    assert queue.limits.max_sectors == 8


def test_parent_bio_waits_flush_the_plug_of_its_pieces():
    device, queue = make_queue(window=100, limits=QueueLimits(max_sectors_kb=4))
    bio = write_bio(0, 32)
    queue.submit_and_wait(bio, timeout=5)
    assert sum(rq.nr_sectors for rq in device.requests) == 32


def test_concurrent_sequential_writers_get_large_requests():
    regions, per_client, depth = 16, 32, 8
    device = RecordingDevice(nr_sectors=regions * per_client * 8)
    queue = BlockQueue(device.dispatch, limits=QueueLimits())
    errors = []

    def client(index):
        try:
            pending = []
            for block in range(per_client):
                sector = (index * per_client + block) * 8
                bio = write_bio(sector, 8, fill=index + 1)
                queue.submit_bio(bio)
                pending.append(bio)
                if len(pending) >= depth:
                    pending.pop(0).wait(5)
            wait_all(pending)
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=client, args=(index,)) for index in range(regions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    stats = queue.stats.snapshot()
    assert stats["w_bios"] == regions * per_client
    assert stats["wareq_sz"] >= 16  # 4 KiB bios merged at least four by four on average
    for index in range(regions):
        start = index * per_client * 8 * SECTOR
        assert device.data[start : start + per_client * 8 * SECTOR] == bytes([index + 1]) * (
            per_client * 8 * SECTOR
        )
    assert device.violations == []


def _on_device_at_first_dispatch(bios):
    seen = []
    device = RecordingDevice()

    def dispatch(request):
        if not seen:
            seen.append(queue.stats.snapshot()["on_device"])
        device.dispatch(request)

    queue = BlockQueue(dispatch, limits=device.limits, plug_window_us=LONG_WINDOW_US)
    submit_all(queue, bios)
    queue.finish_plug()
    wait_all(bios)
    assert len(device.requests) == len(bios)
    return seen[0]


def test_small_ready_requests_go_to_the_device_as_one_batch():
    # Four apart 4 KiB writes: all four hold a tag when the first is dispatched (queue_rqs).
    assert _on_device_at_first_dispatch([write_bio(64 * i, 8) for i in range(4)]) == 4


def test_a_big_request_is_dispatched_alone_so_another_thread_can_take_the_next():
    big = 256  # 128 KiB each, apart: two requests
    assert _on_device_at_first_dispatch([write_bio(0, big), write_bio(4 * big, big)]) == 1
