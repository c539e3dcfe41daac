"""blktrace for a volume's queue: events as blkparse prints them, and btt's summary of them.

Nothing is built while nobody listens: the queue holds ``tracer = None`` and
every hook is ``if tracer is not None``, one attribute load on the hot path.
A listener gets a ``TraceBuffer`` of bounded length; when it is full, further
events are counted as dropped (blkparse's "Skips"), never waited for: I/O does
not slow down because a reader is slow.

Actions, as the kernel's blktrace names them (``blk_add_trace_*``):

====== ===================================================================
``Q``  a bio entered the queue (after splitting to the queue limits)
``M``  it back-merged into a pending request; ``F``: front-merged
``G``  it got a new request
``P``  the plug opened (first request of a plug generation); ``U``: it was
       flushed, with the number of requests it held
``I``  a request was inserted into the elevator
``D``  a request was dispatched to the target (its whole sector range)
``C``  a request completed; the bracket holds its status (0, or -5 = EIO)
``m``  a message: ``crypt <encrypt|decrypt> <sector> + <sectors> calls=<n>
       mode=<bulk|per-unit> units=<data units> unit_size=<bytes>
       iv=<IV mode>`` is one request's engine calls
====== ===================================================================

Devices show as ``253,<minor>`` (device-mapper's major), all on CPU 0, with the
submitting thread's id as pid. ``parse_blkparse`` reads the same text back
(this service's or a real ``blkparse``'s) and ``summarize`` computes btt's
Q2Q, Q2G, G2I, I2D, D2C and Q2C and the merge ratio from it.
"""

from __future__ import annotations

import math
import re
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from app.vocab import Op

__all__ = [
    "DM_MAJOR",
    "BadLines",
    "Event",
    "Record",
    "Summary",
    "TraceBuffer",
    "TraceParse",
    "Tracer",
    "format_event",
    "format_trailer",
    "parse_blkparse",
    "render_summary",
    "rwbs",
    "summarize",
]

DM_MAJOR = 253
PROCESS = "reqcrypt"
#: Events one listener holds before further ones are dropped (about 100 bytes each).
DEFAULT_CAPACITY = 65536


def rwbs(op: Op, *, fua: bool = False, preflush: bool = False) -> str:
    """blk_fill_rwbs: F for a preflush, the op letter, then F for FUA."""
    letters = "F" if preflush else ""
    letters += {Op.READ: "R", Op.WRITE: "W", Op.DISCARD: "D", Op.FLUSH: "F"}.get(op, "N")
    return letters + ("F" if fua else "")


@dataclass(slots=True)
class Event:
    """One trace event; ``detail`` is C's status, U's request count or m's text."""

    time_ns: int
    action: str
    rwbs: str
    sector: int
    nr_sectors: int
    pid: int
    detail: str = ""


class TraceBuffer:
    """One listener's events, at most ``capacity``; the rest are counted in ``dropped``."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, expires: float | None = None) -> None:
        self.capacity = capacity
        self.expires = expires
        self.dropped = 0
        self.delivered = 0
        self._events: deque[Event] = deque()
        self._lock = threading.Lock()

    def push(self, event: Event) -> None:
        with self._lock:
            if len(self._events) >= self.capacity:
                self.dropped += 1
            else:
                self._events.append(event)

    def drain(self) -> list[Event]:
        """Every event held, in time order; the buffer is empty afterwards."""
        with self._lock:
            events = list(self._events)
            self._events.clear()
            self.delivered += len(events)
        events.sort(key=lambda event: event.time_ns)
        return events


class Tracer:
    """What a queue holds while someone listens: builds events and hands them to listeners."""

    __slots__ = ("buffers",)

    def __init__(self, buffers: Sequence[TraceBuffer]) -> None:
        self.buffers = tuple(buffers)

    def emit(
        self, now: int, action: str, flags: str, sector: int, nr_sectors: int, detail: str = ""
    ) -> None:
        event = Event(now, action, flags, sector, nr_sectors, threading.get_native_id(), detail)
        for buffer in self.buffers:
            buffer.push(event)

    def bio(self, now: int, action: str, op: Op, sector: int, nr_sectors: int, fua: bool) -> None:
        self.emit(now, action, rwbs(op, fua=fua), sector, nr_sectors)

    def request(
        self, now: int, action: str, op: Op, sector: int, nr_sectors: int, fua: bool, detail: str
    ) -> None:
        self.emit(now, action, rwbs(op, fua=fua), sector, nr_sectors, detail)

    def message(self, now: int, text: str) -> None:
        self.emit(now, "m", "N", 0, 0, text)


def _header(event: Event, seq: int, start_ns: int, minor: int) -> str:
    elapsed = max(0, event.time_ns - start_ns)
    seconds, nanoseconds = divmod(elapsed, 1_000_000_000)
    return (
        f"{DM_MAJOR:3d},{minor:<3d} {0:2d} {seq:8d} {seconds:5d}.{nanoseconds:09d} "
        f"{event.pid:5d} {event.action:>2} {event.rwbs:>3} "
    )


def format_event(event: Event, seq: int, start_ns: int, minor: int = 0) -> str:
    """One line as blkparse's default output prints it (without the newline)."""
    head = _header(event, seq, start_ns, minor)
    action = event.action
    if action == "m":
        return head + event.detail
    if action == "P":
        return head + f"[{PROCESS}]"
    if action == "U":
        return head + f"[{PROCESS}] {event.detail}"
    if action == "C":
        return head + f"{event.sector} + {event.nr_sectors} [{event.detail or 0}]"
    if event.nr_sectors == 0:
        return head + f"[{PROCESS}]"
    return head + f"{event.sector} + {event.nr_sectors} [{PROCESS}]"


def format_trailer(events: int, dropped: int, minor: int = 0) -> str:
    """blkparse's closing lines: how many events, and how many were lost ("Skips")."""
    total = events + dropped
    share = dropped / total * 100 if total else 0.0
    return (
        f"Events ({DM_MAJOR},{minor}): {events} entries\n"
        f"Skips: {dropped} forward ({dropped} - {share:5.1f}%)\n"
    )


# ------------------------------------------------------------------ reading


@dataclass(frozen=True, slots=True)
class Record:
    """One parsed blkparse event line; ``sector`` is None for lines without one (P, U, m)."""

    line: int
    time_ns: int
    pid: int
    action: str
    rwbs: str
    sector: int | None
    nr_sectors: int
    rest: str


@dataclass(slots=True)
class BadLines:
    """Lines a reader could not take: how many, and the first few to show (line, text)."""

    count: int = 0
    examples: list[tuple[int, str]] = field(default_factory=list)

    def add(self, number: int, text: str) -> None:
        self.count += 1
        if len(self.examples) < 5:
            self.examples.append((number, text[:120]))


@dataclass(slots=True)
class TraceParse:
    """Records read and the lines that were neither events nor blkparse's summary."""

    records: list[Record] = field(default_factory=list)
    bad: BadLines = field(default_factory=BadLines)


_EVENT = re.compile(
    r"^\s*\d+,\d+\s+\d+\s+\d+\s+(\d+)\.(\d{1,9})\s+(\d+)\s+([A-Za-z]{1,2})\s+([A-Z]+)\s*(.*)$"
)
_RANGE = re.compile(r"^(\d+) \+ (\d+)\b\s*(.*)$")
#: blkparse's closing summary starts with a per-CPU or per-device block.
_SUMMARY = re.compile(r"^(CPU\d+|Total) \(|^(Throughput|Events|Skips)\b")


def parse_blkparse(lines: Iterable[str]) -> TraceParse:
    """Event lines of blkparse text; the closing summary is skipped, other lines counted bad."""
    parsed = TraceParse()
    in_summary = False
    for number, raw in enumerate(lines, 1):
        text = raw.rstrip("\r\n")
        if not text.strip():
            continue
        if _SUMMARY.match(text.lstrip()) and not _EVENT.match(text):
            in_summary = True
            continue
        match = _EVENT.match(text)
        if match is None:
            if not in_summary:
                parsed.bad.add(number, text)
            continue
        in_summary = False
        seconds, fraction, pid, action, flags, rest = match.groups()
        time_ns = int(seconds) * 1_000_000_000 + int(fraction.ljust(9, "0"))
        sector: int | None = None
        nr_sectors = 0
        if action != "m":
            found = _RANGE.match(rest)
            if found is not None:
                sector, nr_sectors = int(found.group(1)), int(found.group(2))
                rest = found.group(3)
        parsed.records.append(
            Record(number, time_ns, int(pid), action, flags, sector, nr_sectors, rest)
        )
    return parsed


# ------------------------------------------------------------------ btt


@dataclass(slots=True)
class _Pending:
    start: int
    end: int
    g: int
    queued: list[int]
    inserted: int | None = None
    dispatched: int | None = None


@dataclass(slots=True)
class _Series:
    values: list[float] = field(default_factory=list)

    def add(self, ns: int) -> None:
        self.values.append(ns / 1e9)


@dataclass(slots=True)
class Summary:
    """btt's per-phase latencies (seconds) and the device merge information."""

    phases: dict[str, list[float]]
    queued: int
    dispatched: int
    back_merges: int
    front_merges: int
    dispatched_sectors: list[int]
    engine_calls: int
    bulk_requests: int
    unit_requests: int

    @property
    def merge_ratio(self) -> float:
        """#Q / #D: bios per dispatched request."""
        return self.queued / self.dispatched if self.dispatched else math.nan


PHASES = ("Q2Q", "Q2G", "G2I", "I2D", "D2C", "Q2C")
_ENGINE = re.compile(r"^crypt \w+ \d+ \+ \d+ calls=(\d+) mode=(\S+)")


def summarize(records: Iterable[Record]) -> Summary:
    """btt over parsed events: requests are followed by start sector through M/F/I/D/C."""
    series = {name: _Series() for name in PHASES}
    queued_at: dict[int, int] = {}
    by_start: dict[int, _Pending] = {}
    by_end: dict[int, _Pending] = {}
    last_q: int | None = None
    summary = Summary({}, 0, 0, 0, 0, [], 0, 0, 0)
    for record in records:
        action, sector, t = record.action, record.sector, record.time_ns
        if action == "m":
            engine = _ENGINE.match(record.rest)
            if engine is not None:
                summary.engine_calls += int(engine.group(1))
                if engine.group(2) == "bulk":
                    summary.bulk_requests += 1
                else:
                    summary.unit_requests += 1
            continue
        if sector is None:
            continue
        end = sector + record.nr_sectors
        if action == "Q":
            summary.queued += 1
            if last_q is not None:
                series["Q2Q"].add(t - last_q)
            last_q = t
            queued_at[sector] = t
        elif action == "G":
            q = queued_at.pop(sector, None)
            pending = _Pending(sector, end, t, [] if q is None else [q])
            if q is not None:
                series["Q2G"].add(t - q)
            by_start[sector] = by_end[end] = pending
        elif action in ("M", "F"):
            if action == "M":
                summary.back_merges += 1
                merged = by_end.pop(sector, None)
            else:
                summary.front_merges += 1
                merged = by_start.pop(end, None)
            q = queued_at.pop(sector, None)
            if merged is None:
                continue
            if action == "M":
                merged.end = end
                by_end[end] = merged
            else:
                merged.start = sector
                by_start[sector] = merged
            if q is not None:
                merged.queued.append(q)
        elif action in ("I", "D", "C"):
            request = by_start.get(sector)
            if request is None:
                continue
            if action == "I" and request.inserted is None:
                request.inserted = t
                series["G2I"].add(t - request.g)
            elif action == "D":
                summary.dispatched += 1
                summary.dispatched_sectors.append(record.nr_sectors)
                request.dispatched = t
                if request.inserted is not None:
                    series["I2D"].add(t - request.inserted)
            elif action == "C" and request.dispatched is not None:
                del by_start[sector]
                by_end.pop(request.end, None)
                series["D2C"].add(t - request.dispatched)
                for q in request.queued:
                    series["Q2C"].add(t - q)
    summary.phases = {name: s.values for name, s in series.items()}
    return summary


def render_summary(summary: Summary, minor: int = 0) -> str:
    """btt's "All Devices" table and its "Device Merge Information"."""
    rule = "--------------- ------------- ------------- ------------- -----------"
    lines = [
        "==================== All Devices ====================",
        "",
        "            ALL           MIN           AVG           MAX           N",
        rule,
        "",
    ]
    for name in PHASES:
        values = summary.phases.get(name, [])
        if values:
            low, mean, high = min(values), sum(values) / len(values), max(values)
            lines.append(f"{name:<15} {low:13.9f} {mean:13.9f} {high:13.9f} {len(values):11d}")
    lines += ["", "==================== Device Merge Information ====================", ""]
    lines.append("       DEV |       #Q       #D   Ratio |   BLKmin   BLKavg   BLKmax    Total")
    lines.append("---------- | -------- -------- ------- | -------- -------- -------- --------")
    sizes = summary.dispatched_sectors or [0]
    lines.append(
        f" ({DM_MAJOR},{minor:3d}) | {summary.queued:8d} {summary.dispatched:8d} "
        f"{summary.merge_ratio:7.1f} | {min(sizes):8d} {sum(sizes) // len(sizes):8d} "
        f"{max(sizes):8d} {sum(sizes):8d}"
    )
    lines += [
        "",
        f"back merges {summary.back_merges}, front merges {summary.front_merges}; "
        f"engine calls {summary.engine_calls} over {summary.bulk_requests} bulk and "
        f"{summary.unit_requests} per-unit requests",
    ]
    return "\n".join(lines) + "\n"
