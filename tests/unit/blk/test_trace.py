import re

import pytest

from app.blk import BlockQueue, Op
from app.blk import trace as trace_module
from app.blk.queue import MAX_TRACE_LISTENERS
from app.blk.trace import (
    Event,
    TraceBuffer,
    format_event,
    format_trailer,
    parse_blkparse,
    render_summary,
    rwbs,
    summarize,
)
from app.errors import TargetIOError, Unavailable

from .helpers import RecordingDevice, run, write_bio

LONG_WINDOW_US = 10_000_000


def make_queue(dispatch=None, **options):
    device = RecordingDevice()
    return device, BlockQueue(
        dispatch or device.dispatch, limits=device.limits, plug_window_us=LONG_WINDOW_US, **options
    )


def traced(queue, bios):
    listener = queue.listen()
    run(queue, bios)
    queue.unlisten(listener)
    return listener.drain()


def actions(events):
    return [(event.action, event.sector, event.nr_sectors) for event in events]


def test_event_line_is_blkparse_default_format():
    event = Event(1_000_002_500, "Q", "W", 2048, 8, 1234)
    line = format_event(event, 1, start_ns=1_000_000_000)
    assert line == "253,0    0        1     0.000002500  1234  Q   W 2048 + 8 [reqcrypt]"


def test_completion_line_carries_the_status_and_unplug_the_request_count():
    assert format_event(Event(0, "C", "R", 8, 8, 7, "-5"), 3, 0).endswith("C   R 8 + 8 [-5]")
    assert format_event(Event(0, "U", "N", 0, 0, 7, "2"), 4, 0).endswith("U   N [reqcrypt] 2")


def test_rwbs_letters_follow_the_kernel():
    assert rwbs(Op.WRITE, fua=True, preflush=True) == "FWF"
    assert rwbs(Op.FLUSH) == "F"
    assert rwbs(Op.DISCARD) == "D"
    assert rwbs(Op.WRITE_ZEROES) == "N"


def test_merged_bios_trace_queue_merge_plug_insert_dispatch_complete():
    _, queue = make_queue()
    events = traced(queue, [write_bio(0, 8), write_bio(8, 8), write_bio(32, 8), write_bio(24, 8)])
    assert actions(events) == [
        ("Q", 0, 8),
        ("G", 0, 8),
        ("P", 0, 0),
        ("Q", 8, 8),
        ("M", 8, 8),
        ("Q", 32, 8),
        ("G", 32, 8),
        ("Q", 24, 8),
        ("F", 24, 8),
        ("U", 0, 0),
        ("I", 0, 16),
        ("I", 24, 16),
        ("D", 0, 16),
        ("D", 24, 16),
        ("C", 0, 16),
        ("C", 24, 16),
    ]
    assert [event.detail for event in events if event.action in "UC"] == ["2", "0", "0"]


def test_failed_request_completes_with_eio_status():
    def failing(rq):
        raise TargetIOError("bad sector")

    _, queue = make_queue(failing)
    listener = queue.listen()
    bio = write_bio(0, 8)
    queue.submit_bio(bio)
    queue.finish_plug()
    with pytest.raises(TargetIOError):
        bio.wait(5)
    completions = [event for event in listener.drain() if event.action == "C"]
    assert [event.detail for event in completions] == ["-5"]


def test_no_event_is_built_while_nobody_listens(monkeypatch):
    built = []

    class CountingEvent(Event):
        __slots__ = ()

        def __init__(self, *args, **kwargs):
            built.append(args)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(trace_module, "Event", CountingEvent)
    _, queue = make_queue()
    run(queue, [write_bio(8 * i, 8) for i in range(4)])
    assert built == []
    assert queue.tracer is None
    traced(queue, [write_bio(64, 8)])
    assert built  # the same path builds events once someone listens
    assert queue.tracer is None  # and stops when the listener leaves


def test_full_buffer_drops_and_counts_instead_of_blocking():
    _, queue = make_queue()
    listener = queue.listen(capacity=3)
    run(queue, [write_bio(16 * i, 8) for i in range(4)])
    assert len(listener.drain()) == 3
    assert listener.dropped > 0


def test_listeners_are_bounded():
    _, queue = make_queue()
    for _ in range(MAX_TRACE_LISTENERS):
        queue.listen()
    with pytest.raises(Unavailable):
        queue.listen()


def _blkparse_text(events):
    lines = [format_event(event, seq, 0) for seq, event in enumerate(events, 1)]
    return lines + format_trailer(len(events), 0).splitlines()


def test_own_trace_parses_back_and_trailer_is_not_a_bad_line():
    _, queue = make_queue()
    events = traced(queue, [write_bio(0, 8), write_bio(8, 8)])
    parsed = parse_blkparse(_blkparse_text(events))
    assert parsed.bad.count == 0
    assert [(r.action, r.sector or 0, r.nr_sectors) for r in parsed.records] == actions(events)


def test_kernel_blkparse_with_totals_section_and_garbage():
    text = """\
  8,0    3        1     0.000000000   697  Q  WS 223490 + 8 [kjournald]
  8,0    3        2     0.000001829   697  G  WS 223490 + 8 [kjournald]
  8,0    3        3     0.000002553   697  P   N [kjournald]
not an event
  8,0    3        4     0.000004051   697  I  WS 223490 + 8 [kjournald]
  8,0    3        5     0.000005473   697  U   N [kjournald] 1
  8,0    3        6     0.000007028   697  D  WS 223490 + 8 [kjournald]
  8,0    1        1     0.000424577     0  C  WS 223490 + 8 [0]
CPU3 (8,0):
 Reads Queued:           0,        0KiB  Writes Queued:           1,        4KiB
Total (8,0):
 Writes Queued:           1,        4KiB
Throughput (R/W): 0KiB/s / 9KiB/s
Events (8,0): 7 entries
Skips: 0 forward (0 -   0.0%)
"""
    parsed = parse_blkparse(text.splitlines())
    assert parsed.bad.count == 1
    assert parsed.bad.examples == [(4, "not an event")]
    assert [r.action for r in parsed.records] == ["Q", "G", "P", "I", "U", "D", "C"]
    summary = summarize(parsed.records)
    assert summary.phases["Q2C"] == [pytest.approx(0.000424577)]
    assert summary.phases["D2C"] == [pytest.approx(0.000424577 - 0.000007028)]


def test_summary_counts_merges_and_ratio():
    _, queue = make_queue()
    events = traced(queue, [write_bio(8 * i, 8) for i in range(4)])
    summary = summarize(parse_blkparse(_blkparse_text(events)).records)
    assert (summary.queued, summary.dispatched, summary.back_merges) == (4, 1, 3)
    assert summary.merge_ratio == 4.0
    assert len(summary.phases["Q2C"]) == 4
    text = render_summary(summary)
    assert re.search(r"\(253,\s+0\) \|\s+4\s+1\s+4\.0 \|", text)
    assert "Q2C" in text


def test_trace_buffer_drain_orders_by_time():
    buffer = TraceBuffer()
    buffer.push(Event(20, "D", "W", 0, 8, 1))
    buffer.push(Event(10, "Q", "W", 0, 8, 2))
    assert [event.time_ns for event in buffer.drain()] == [10, 20]
    assert buffer.delivered == 2


def test_an_expired_listener_gives_its_place_to_a_new_one():
    _, queue = make_queue()
    gone = [queue.listen(expires=0.0) for _ in range(MAX_TRACE_LISTENERS)]
    fresh = queue.listen()
    assert queue.tracer is not None
    assert queue.tracer.buffers == (fresh,)
    assert all(listener not in queue.tracer.buffers for listener in gone)
