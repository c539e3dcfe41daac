import pytest

from app.blk import Bio, BlockQueue, Op, QueueLimits, QueueStats
from app.blk.request import Request

from .helpers import RecordingDevice, read_bio, run, write_bio


def test_counters_follow_iostat_meaning():
    device = RecordingDevice()
    stats = QueueStats()
    queue = BlockQueue(
        device.dispatch, limits=QueueLimits(), plug_window_us=10_000_000, stats=stats
    )
    run(queue, [write_bio(8 * i, 8) for i in range(4)] + [write_bio(200, 8), write_bio(192, 8)])
    run(queue, [read_bio(0, 8), read_bio(8, 8)])
    run(queue, [Bio(Op.DISCARD, 1000, 8), Bio(Op.FLUSH, 0, 0)])
    stats.add_engine_calls(7)
    snap = stats.snapshot()
    assert (snap["w_bios"], snap["w_ios"], snap["w_merges"]) == (6, 2, 4)
    assert (snap["back_merges"], snap["front_merges"]) == (4, 1)
    assert snap["w_sectors"] == 48
    assert snap["wareq_sz"] == 12.0
    assert (snap["r_bios"], snap["r_ios"], snap["r_merges"], snap["rareq_sz"]) == (2, 1, 1, 8.0)
    assert (snap["d_ios"], snap["f_ios"]) == (1, 1)
    assert snap["request_size_histogram"] == {4: 1, 8: 2, 16: 1}
    assert snap["engine_calls"] == 7
    assert snap["in_flight"] == 0
    assert snap["w_await"] > 0
    assert snap["aqu_sz"] > 0
    assert snap["svctm"] > 0
    stats.reset()
    snap = stats.snapshot()
    assert snap["w_ios"] == 0
    assert snap["engine_calls"] == 0
    assert snap["request_size_histogram"] == {}


def test_in_flight_counts_plugged_and_queued_requests():
    device = RecordingDevice()
    queue = BlockQueue(device.dispatch, limits=QueueLimits(), plug_window_us=10_000_000)
    bios = [write_bio(0, 8), write_bio(100, 8)]
    for bio in bios:
        queue.submit_bio(bio)
    assert queue.in_flight == 2
    assert queue.stats.snapshot()["in_flight"] == 2
    queue.finish_plug()
    assert queue.in_flight == 0
    assert queue.stats.snapshot()["in_flight"] == 0


def test_cumulative_ticks_let_a_client_take_deltas():
    """iostat divides deltas: the totals behind the averages are exported too."""
    device = RecordingDevice()
    stats = QueueStats()
    queue = BlockQueue(
        device.dispatch, limits=QueueLimits(), plug_window_us=10_000_000, stats=stats
    )
    run(queue, [write_bio(0, 8), write_bio(8, 8), write_bio(100, 8)])
    snap = stats.snapshot()
    assert snap["w_bios_done"] == 3
    assert snap["w_ticks_ms"] == pytest.approx(snap["w_await"] * 3)
    assert snap["io_ticks_ms"] == pytest.approx(snap["util"] * snap["elapsed_s"] * 1e3)
    assert snap["time_in_queue_ms"] == pytest.approx(snap["aqu_sz"] * snap["elapsed_s"] * 1e3)
    assert snap["time_in_queue_ms"] >= snap["io_ticks_ms"] > 0


def test_a_completion_stamped_before_the_last_change_never_shrinks_queue_time():
    stats = QueueStats()
    stats.request_started(1_000, Op.WRITE)
    stats.request_started(2_000, Op.WRITE)
    first, second = write_bio(0, 8), write_bio(64, 8)
    rqs = [Request.from_bio(bio, 1 << 16) for bio in (first, second)]
    stats.requests_dispatched(rqs, 2_000)
    stats.requests_done(rqs[1:], [5_000])
    before = stats.snapshot()["time_in_queue_ms"]
    stats.requests_done(rqs[:1], [4_000])  # a batch's earlier request, accounted late
    assert stats.snapshot()["time_in_queue_ms"] >= before
    assert stats.snapshot()["in_flight"] == 0
