"""Random concurrent histories against a BlockQueue over an in-memory device.

Every write stamps each 512-byte unit with (write id, sector), so a unit tells
which write it came from and that it is whole. Logical clock ticks taken
before and after each submit, and after each completion, give "definitely
issued before" (A.issue_end < B.issue_start). The checker demands:

* every unit on the device and in every read is whole and from a write that
  covers it (or zero where no such write applies);
* the final unit comes from a write no other covering write was definitely
  issued after (overlapping writes land in issue order);
* a read sees, per unit, a write issued before it completed and no write
  definitely issued between that write and the read;
* a FLUSH reaches the dispatcher after every unit of every write definitely
  issued before it.
"""

from __future__ import annotations

import itertools
import struct
import threading
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.blk import Bio, BlockQueue, Op, QueueLimits, Request

from .helpers import SECTOR, RecordingDevice

DEVICE_SECTORS = 64


def pattern(write_id: int, sector: int) -> bytes:
    return struct.pack("<QQ", write_id, sector) * (SECTOR // 16)


def decode(unit: bytes) -> tuple[int, int] | None:
    if unit == bytes(SECTOR):
        return None
    write_id, sector = struct.unpack_from("<QQ", unit)
    return (write_id, sector) if unit == pattern(write_id, sector) else (-1, -1)


@dataclass
class Event:
    kind: str
    sector: int
    nr_sectors: int
    write_id: int = 0
    bio: Bio | None = None
    issue_start: int = 0
    issue_end: int = 0
    complete: int = 0
    data: bytes = b""


@dataclass
class FlushDevice(RecordingDevice):
    flushed: dict[int, frozenset[tuple[int, int]]] = field(default_factory=dict)
    applied: set[tuple[int, int]] = field(default_factory=set)

    def __init__(self, limits: QueueLimits, boundaries: tuple[int, ...]) -> None:
        RecordingDevice.__init__(self, DEVICE_SECTORS, limits, boundaries)
        self.flushed = {}
        self.applied = set()

    def dispatch(self, rq: Request) -> None:
        RecordingDevice.dispatch(self, rq)
        with self.lock:
            if rq.op is Op.WRITE:
                for index in range(rq.nr_sectors):
                    start = (rq.sector + index) * SECTOR
                    decoded = decode(bytes(self.data[start : start + SECTOR]))
                    if decoded is not None:
                        self.applied.add(decoded)
            elif rq.op is Op.FLUSH:
                self.flushed[id(rq.bios[0])] = frozenset(self.applied)


def definitely_before(first: Event, second: Event) -> bool:
    return first.issue_end < second.issue_start


def covers(event: Event, sector: int) -> bool:
    return event.sector <= sector < event.sector + event.nr_sectors


def check_history(
    events: list[Event], device: bytes, flushed: dict[int, frozenset[tuple[int, int]]]
) -> list[str]:
    """Violations of the ordering contract; empty when the history is acceptable."""
    problems: list[str] = []
    writes = {event.write_id: event for event in events if event.kind == "write"}

    def source(unit: bytes, sector: int, where: str) -> Event | None:
        decoded = decode(unit)
        if decoded is None:
            return None
        write_id, unit_sector = decoded
        write = writes.get(write_id)
        if write is None or unit_sector != sector or not covers(write, sector):
            problems.append(f"{where}: sector {sector} holds torn or foreign data")
            return None
        return write

    for sector in range(DEVICE_SECTORS):
        unit = device[sector * SECTOR : (sector + 1) * SECTOR]
        covering = [write for write in writes.values() if covers(write, sector)]
        final = source(unit, sector, "device")
        if final is None:
            if covering and decode(unit) is None:
                problems.append(f"device: sector {sector} lost every write")
            continue
        for other in covering:
            if definitely_before(final, other):
                problems.append(
                    f"device: sector {sector} from {final.write_id}, not later {other.write_id}"
                )

    for read in (event for event in events if event.kind == "read"):
        for index in range(read.nr_sectors):
            sector = read.sector + index
            unit = read.data[index * SECTOR : (index + 1) * SECTOR]
            seen = source(unit, sector, f"read@{read.issue_start}")
            issued_before = [
                write
                for write in writes.values()
                if covers(write, sector) and definitely_before(write, read)
            ]
            if seen is None:
                if issued_before and decode(unit) is None:
                    problems.append(
                        f"read: sector {sector} missed write {issued_before[0].write_id}"
                    )
                continue
            if seen.issue_start > read.complete:
                problems.append(f"read: sector {sector} saw a write from its future")
            for later in issued_before:
                if definitely_before(seen, later):
                    problems.append(
                        f"read: sector {sector} saw {seen.write_id}, not newer {later.write_id}"
                    )

    for flush in (event for event in events if event.kind == "flush"):
        assert flush.bio is not None
        snapshot = flushed.get(id(flush.bio), frozenset())
        for write in writes.values():
            if definitely_before(write, flush):
                for sector in range(write.sector, write.sector + write.nr_sectors):
                    if (write.write_id, sector) not in snapshot:
                        problems.append(f"flush before write {write.write_id} reached the device")
                        break
    return problems


op_strategy = st.one_of(
    st.tuples(st.just("write"), st.integers(0, DEVICE_SECTORS - 1), st.integers(1, 16)),
    st.tuples(st.just("read"), st.integers(0, DEVICE_SECTORS - 1), st.integers(1, 16)),
    st.tuples(st.just("flush"), st.just(0), st.just(0)),
)
client_strategy = st.tuples(
    st.lists(op_strategy, min_size=1, max_size=8),
    st.integers(1, 4),  # queue depth
    st.booleans(),  # one segment per sector
)


def run_history(queue: BlockQueue, clients) -> list[Event]:
    clock = itertools.count(1)
    write_ids = itertools.count(1)
    events: list[Event] = []
    lock = threading.Lock()
    failures: list[BaseException] = []

    def client(ops, depth, fragmented):
        pending: list[tuple[Event, bytearray | None]] = []

        def finish(event: Event, buffer: bytearray | None) -> None:
            assert event.bio is not None
            event.bio.wait(10)
            event.complete = next(clock)
            if buffer is not None:
                event.data = bytes(buffer)

        try:
            for kind, sector, nr_sectors in ops:
                nr_sectors = min(nr_sectors, DEVICE_SECTORS - sector)
                buffer: bytearray | None = None
                if kind == "flush":
                    event = Event(kind, 0, 0, bio=Bio(Op.FLUSH, 0, 0))
                else:
                    if kind == "write":
                        write_id = next(write_ids)
                        buffer = bytearray(
                            b"".join(pattern(write_id, sector + i) for i in range(nr_sectors))
                        )
                    else:
                        write_id = 0
                        buffer = bytearray(nr_sectors * SECTOR)
                    view = memoryview(buffer)
                    segments = (
                        [view[i * SECTOR : (i + 1) * SECTOR] for i in range(nr_sectors)]
                        if fragmented
                        else [view]
                    )
                    op = Op.WRITE if kind == "write" else Op.READ
                    event = Event(
                        kind, sector, nr_sectors, write_id, Bio(op, sector, nr_sectors, segments)
                    )
                    if kind == "write":
                        buffer = None
                event.issue_start = next(clock)
                queue.submit_bio(event.bio)
                event.issue_end = next(clock)
                with lock:
                    events.append(event)
                pending.append((event, buffer))
                if len(pending) >= depth:
                    finish(*pending.pop(0))
            for item in pending:
                finish(*item)
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=client, args=spec) for spec in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not failures, failures
    return events


@pytest.mark.parametrize("elevator", ["none", "mq-deadline"])
@pytest.mark.parametrize("mode", ["request", "bio"])
@settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    clients=st.lists(client_strategy, min_size=2, max_size=4),
    max_sectors_kb=st.sampled_from([2, 4, 1280]),
    max_segments=st.sampled_from([2, 128]),
    boundaries=st.sets(st.sampled_from(range(8, DEVICE_SECTORS, 8)), max_size=3),
    window_us=st.sampled_from([0, 30, 300]),
)
def test_concurrent_histories_respect_ordering(
    mode, elevator, clients, max_sectors_kb, max_segments, boundaries, window_us
):
    limits = QueueLimits(max_sectors_kb=max_sectors_kb, max_segments=max_segments)
    bounds = tuple(sorted(boundaries))
    device = FlushDevice(limits, bounds)
    queue = BlockQueue(
        device.dispatch,
        limits=limits,
        boundaries=bounds,
        dispatch_mode=mode,
        elevator=elevator,
        plug_window_us=window_us,
    )
    events = run_history(queue, clients)
    assert queue.drain(10)
    assert device.violations == []
    assert check_history(events, bytes(device.data), device.flushed) == []


def test_checker_catches_reordered_writes():
    first = Event("write", 0, 1, write_id=1, issue_start=1, issue_end=2, complete=5)
    second = Event("write", 0, 1, write_id=2, issue_start=3, issue_end=4, complete=6)
    device = pattern(1, 0) + bytes(SECTOR * (DEVICE_SECTORS - 1))
    assert check_history([first, second], device, {}) != []
    good = pattern(2, 0) + bytes(SECTOR * (DEVICE_SECTORS - 1))
    assert check_history([first, second], good, {}) == []


def test_checker_catches_torn_units_stale_reads_and_early_flushes():
    write = Event("write", 0, 1, write_id=1, issue_start=1, issue_end=2, complete=3)
    torn = pattern(1, 0)[:256] + bytes(256) + bytes(SECTOR * (DEVICE_SECTORS - 1))
    assert check_history([write], torn, {}) != []
    stale = Event("read", 0, 1, issue_start=4, issue_end=5, complete=6, data=bytes(SECTOR))
    device = pattern(1, 0) + bytes(SECTOR * (DEVICE_SECTORS - 1))
    assert check_history([write, stale], device, {}) != []
    flush_bio = Bio(Op.FLUSH, 0, 0)
    flush = Event("flush", 0, 0, bio=flush_bio, issue_start=4, issue_end=5, complete=6)
    assert check_history([write, flush], device, {id(flush_bio): frozenset()}) != []
    assert check_history([write, flush], device, {id(flush_bio): frozenset({(1, 0)})}) == []
