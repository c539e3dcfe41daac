"""Replay a user's block trace against a modelled volume, in bio and in request dispatch.

Input: blkparse text (its ``Q`` events: each bio as it entered the queue; other
events and the closing summary are skipped, lines that are neither are counted
and shown) or a fio iolog, version 2 (``filename action offset length``, ``wait``
lines advance time) or 3 (``timestamp_ms filename action offset length``).

The bios go through a real ``BlockQueue`` (the service's own plug, merge,
elevator and limits code) whose dispatch only records each request, so the
merges are the ones the volume would make. Time is modelled apart from it, on
a virtual clock: a request holds one of ``queue_depth`` tags from dispatch to
completion; a write is encrypted (CPU IVs, then the engine, one request at a
time) and then written; a read is read, then decrypted; the device serves one
I/O at a time (``DeviceModel.io_ns``; writes through its write buffer, if it has
one, drained over the device's idle time). The plug is flushed when its window ends
(``plug_window_us`` after it opened) or by the queue's own thresholds.

Open loop submits each bio at its trace time (rebased to zero); closed loop
keeps ``iodepth`` bios in flight, as fio does, whatever the trace's times: a
submitter waiting for a plugged bio flushes the plug when its window ends, as
the queue's flusher does.

Merges reproduce a recorded run's exactly when its plugs closed as the replay's
do: bios submitted together (one ``submit_bios``, one HTTP batch) share a
timestamp and one plug. Requests waiting in the elevator for a tag take no
later bios in the replay: the queue dispatches at once and the tags are
modelled afterwards.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from app.blk.bio import Bio
from app.blk.limits import QueueLimits
from app.blk.queue import BlockQueue
from app.blk.request import Request
from app.blk.trace import BadLines, parse_blkparse
from app.engine.clock import DeviceState
from app.engine.cost import plan_cost
from app.engine.model import DeviceModel, EngineProfile, ModelSpec
from app.engine.planner import plan_calls
from app.errors import InvalidInput
from app.vocab import DATA_UNIT_SIZES, SECTOR_SIZE, DispatchMode, ElevatorName, Op

__all__ = [
    "MAX_TRACE_BIOS",
    "ParsedTrace",
    "ReplayConfig",
    "TraceBio",
    "model_spec",
    "parse_trace",
    "render_report",
    "replay",
]

#: Bios one replay takes (about 100 bytes of trace text each).
MAX_TRACE_BIOS = 200_000
#: A bio larger than this is not a block-layer bio: the line is counted bad.
MAX_BIO_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class TraceBio:
    """One bio of a trace: nanoseconds since the trace's first, 512-byte sectors."""

    time_ns: int
    op: Literal[Op.READ, Op.WRITE]
    sector: int
    nr_sectors: int


@dataclass(slots=True)
class ParsedTrace:
    """The bios of a trace, what was skipped on purpose and what could not be read."""

    format: str
    bios: list[TraceBio] = field(default_factory=list)
    skipped: int = 0
    bad: BadLines = field(default_factory=BadLines)

    def add(self, time_ns: int, op: Op, offset_sectors: int, nr_sectors: int) -> None:
        if len(self.bios) >= MAX_TRACE_BIOS:
            raise InvalidInput(f"the trace has more than {MAX_TRACE_BIOS} bios; cut it shorter")
        if op is Op.READ or op is Op.WRITE:
            self.bios.append(TraceBio(time_ns, op, offset_sectors, nr_sectors))
        else:
            self.skipped += 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "bios": len(self.bios),
            "skipped": self.skipped,
            "bad_lines": self.bad.count,
            "bad_examples": [{"line": n, "text": text} for n, text in self.bad.examples],
        }


_FIO_HEADER = re.compile(r"^fio version ([23]) iolog\s*$")
_FIO_OPS = {"read": Op.READ, "write": Op.WRITE, "trim": Op.DISCARD}
_FIO_OTHER = {"add", "open", "close", "sync", "datasync"}


def _op_of(flags: str) -> Op | None:
    """The data op of a blkparse RWBS field (F first is a preflush)."""
    letters = flags[1:] if flags.startswith("F") and len(flags) > 1 else flags
    for letter, op in (("R", Op.READ), ("W", Op.WRITE), ("D", Op.DISCARD)):
        if letter in letters:
            return op
    return None


def _parse_blkparse(lines: Sequence[str]) -> ParsedTrace:
    parsed = parse_blkparse(lines)
    trace = ParsedTrace("blkparse", bad=parsed.bad)
    queued = sorted(
        (record for record in parsed.records if record.action == "Q"),
        key=lambda record: record.time_ns,
    )
    trace.skipped = len(parsed.records) - len(queued)
    first = queued[0].time_ns if queued else 0
    for record in queued:
        op = _op_of(record.rwbs)
        if record.sector is None or record.nr_sectors == 0 or op is None:
            trace.skipped += 1
        elif record.nr_sectors * SECTOR_SIZE > MAX_BIO_BYTES:
            trace.bad.add(record.line, f"bio of {record.nr_sectors} sectors")
        else:
            trace.add(record.time_ns - first, op, record.sector, record.nr_sectors)
    return trace


def _parse_iolog(lines: Sequence[str], version: int) -> ParsedTrace:
    trace = ParsedTrace(f"fio iolog v{version}")
    now_ns = 0
    first: int | None = None
    for number, raw in enumerate(lines[1:], 2):
        text = raw.strip()
        if not text:
            continue
        words = text.split()
        if version == 3:
            if len(words) < 3 or not words[0].isdigit():
                trace.bad.add(number, text)
                continue
            stamp = int(words[0]) * 1_000_000
            first = stamp if first is None else first
            now_ns = stamp - first
            words = words[1:]
        if len(words) == 2 and words[1] in _FIO_OTHER:
            continue
        if len(words) != 4 or not words[2].isdigit() or not words[3].isdigit():
            trace.bad.add(number, text)
            continue
        action, offset, length = words[1], int(words[2]), int(words[3])
        if action == "wait" and version == 2:
            now_ns += offset * 1000  # fio v2: the "offset" of a wait is microseconds
        elif action in _FIO_OTHER:
            continue
        elif action not in _FIO_OPS or length <= 0 or length > MAX_BIO_BYTES:
            trace.bad.add(number, text)
        elif offset % SECTOR_SIZE or length % SECTOR_SIZE:
            trace.bad.add(number, f"{text} (not whole 512-byte sectors)")
        else:
            trace.add(now_ns, _FIO_OPS[action], offset // SECTOR_SIZE, length // SECTOR_SIZE)
    trace.bios.sort(key=lambda bio: bio.time_ns)
    if trace.bios and trace.bios[0].time_ns:
        first_bio = trace.bios[0].time_ns
        trace.bios = [replace(bio, time_ns=bio.time_ns - first_bio) for bio in trace.bios]
    return trace


def parse_trace(text: str) -> ParsedTrace:
    """A blkparse text or a fio iolog (v2, v3), told apart by fio's header line."""
    lines = text.splitlines()
    head = next((line for line in lines if line.strip()), "")
    header = _FIO_HEADER.match(head.strip())
    if header is not None:
        start = lines.index(head)
        return _parse_iolog(lines[start:], int(header.group(1)))
    if head.strip().startswith("fio version"):
        raise InvalidInput(f"unsupported fio iolog: {head.strip()!r} (versions 2 and 3 are)")
    return _parse_blkparse(lines)


_LEGACY = re.compile(r"^(\w+)(?::(\d+))?-(\w+)(?:-(\w+)(?::\S+)?)?$")
_CAPI = re.compile(r"^capi:(\w+)\((\w+)\)(?:-(\w+)(?::\S+)?)?$")


def model_spec(cipher: str) -> ModelSpec:
    """The keyless spec the engine decides on, from dm-crypt's cipher text."""
    legacy = _LEGACY.match(cipher)
    if legacy is not None:
        name, keycount, chainmode, ivmode = legacy.groups()
        return ModelSpec(name, chainmode, ivmode, int(keycount or 1))
    capi = _CAPI.match(cipher)
    if capi is not None:
        chainmode, name, ivmode = capi.groups()
        return ModelSpec(name, chainmode, ivmode)
    raise InvalidInput(f"cipher {cipher!r}: expected cipher-chainmode-ivmode or capi:mode(cipher)")


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """The modelled volume and how the trace is driven into it."""

    cipher: str = "aes-xts-plain64"
    sector_size: int = 512
    elevator: ElevatorName = "none"
    queue_depth: int | None = None
    """Device tags; None: the device model's."""
    plug_window_us: int = 50
    loop: Literal["open", "closed"] = "open"
    iodepth: int = 1
    """Bios in flight in closed loop."""
    limits: QueueLimits = field(default_factory=QueueLimits)

    def validate(self) -> None:
        if self.sector_size not in DATA_UNIT_SIZES:
            raise InvalidInput("sector_size must be 512, 1024, 2048 or 4096")
        if self.loop not in ("open", "closed"):
            raise InvalidInput("loop must be 'open' or 'closed'")
        if not 1 <= self.iodepth <= 4096:
            raise InvalidInput("iodepth must be between 1 and 4096")
        if self.plug_window_us < 0:
            raise InvalidInput("plug_window_us must not be negative")
        model_spec(self.cipher)


@dataclass(slots=True)
class _Timeline:
    """Virtual resources: device tags, the engine, the device (one I/O at a time)."""

    tags: list[float]
    device: DeviceState
    engine_free: float = 0.0
    crypto_ns: float = 0.0
    storage_ns: float = 0.0
    bulk_calls: int = 0
    unit_calls: int = 0

    @property
    def engine_calls(self) -> int:
        return self.bulk_calls + self.unit_calls


@dataclass(slots=True)
class _Run:
    """One mode's replay: the queue, what it dispatched and when each bio completed."""

    mode: DispatchMode
    profile: EngineProfile
    device: DeviceModel
    spec: ModelSpec
    config: ReplayConfig
    timeline: _Timeline
    now: float = 0.0
    issued: list[float] = field(default_factory=list)
    completed: list[float] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    bio_index: dict[int, int] = field(default_factory=dict)
    error: Exception | None = None

    def dispatch(self, rq: Request) -> None:
        """The queue's dispatch: the queue fails a request whose dispatch raises; the
        replay keeps the first such error to raise it once the queue is done."""
        try:
            self._model(rq)
        except Exception as error:
            self.error = self.error or error
            raise

    def _model(self, rq: Request) -> None:
        """Model the request's time; it completes at once on the wall clock."""
        self.requests.append(rq)
        line = self.timeline
        nbytes = rq.nr_sectors * SECTOR_SIZE
        start = max(self.now, heapq.heappop(line.tags))
        plan = plan_calls(
            self.profile.capabilities,
            self.spec,
            [segment.nbytes for segment in rq.segments],
            op="decrypt" if rq.op is Op.READ else "encrypt",
            data_unit_size=self.config.sector_size,
            dispatch_mode=self.mode,
            sector=rq.sector,
            bios=[(bio.sector, bio.nr_sectors) for bio in rq.bios],
        )
        cost = plan_cost(self.profile, plan)
        crypto, cpu = cost.makespan_ns, cost.cpu_ns
        line.bulk_calls += plan.bulk_calls
        line.unit_calls += plan.unit_calls
        line.crypto_ns += cpu + crypto
        device = line.device
        if rq.op is Op.READ:
            storage = self.device.io_ns("read", nbytes)
            device_start = max(start, device.busy_until)
            device.busy_until = device_start + storage
            engine_start = max(device.busy_until + cpu, line.engine_free)
            line.engine_free = end = engine_start + crypto
        else:
            engine_start = max(start + cpu, line.engine_free)
            line.engine_free = engine_start + crypto
            device_start = max(line.engine_free, device.busy_until)
            storage = (
                device.buffered_write_ns(nbytes, device_start)
                if self.device.buffered
                else self.device.io_ns("write", nbytes)
            )
            device.busy_until = end = device_start + storage
        line.storage_ns += storage
        heapq.heappush(line.tags, end)
        for bio in rq.bios:
            root = bio
            while root.parent is not None:
                root = root.parent
            index = self.bio_index[id(root)]
            self.completed[index] = max(self.completed[index], end)


def _aligned(bio: TraceBio, unit_sectors: int) -> tuple[int, int]:
    start = bio.sector // unit_sectors * unit_sectors
    end = -(-(bio.sector + bio.nr_sectors) // unit_sectors) * unit_sectors
    return start, end - start


def _drive(run: _Run, bios: Sequence[TraceBio]) -> BlockQueue:
    config = run.config
    unit = config.sector_size // SECTOR_SIZE
    limits = replace(
        config.limits, logical_block_size=max(config.limits.logical_block_size, config.sector_size)
    )
    queue = BlockQueue(
        run.dispatch,
        limits=limits,
        dispatch_mode=run.mode,
        elevator=config.elevator,
        plug_window_us=10**9,  # the replay closes plugs on the virtual clock
    )
    largest = max((_aligned(bio, unit)[1] for bio in bios), default=0)
    zeros = memoryview(bytearray(largest * SECTOR_SIZE))
    window = config.plug_window_us * 1000
    plug_opened: float | None = None
    submitted: list[Bio] = []
    run.issued = [0.0] * len(bios)
    run.completed = [0.0] * len(bios)

    def close_plug(at: float) -> None:
        nonlocal plug_opened
        run.now = at
        queue.finish_plug()
        plug_opened = None

    last_issue = 0.0
    for index, traced in enumerate(bios):
        if config.loop == "open":
            issue = float(traced.time_ns)
        else:
            issue = last_issue
            if index >= config.iodepth:
                waited = index - config.iodepth
                if not submitted[waited].done.is_set() and plug_opened is not None:
                    close_plug(max(issue, plug_opened + window))
                issue = max(issue, run.completed[waited])
        last_issue = issue
        if plug_opened is not None and issue > plug_opened + window:
            close_plug(plug_opened + window)  # bios of one instant share a plug, even at 0 µs
        sector, nr_sectors = _aligned(traced, unit)
        bio = Bio(traced.op, sector, nr_sectors, [zeros[: nr_sectors * SECTOR_SIZE]])
        run.bio_index[id(bio)] = index
        run.issued[index] = issue
        run.completed[index] = issue
        run.now = issue
        queue.submit_bio(bio)
        submitted.append(bio)
        if not bio.done.is_set() and plug_opened is None:
            plug_opened = issue
    if plug_opened is not None:
        close_plug(plug_opened + window)
    return queue


def _percentile(values: Sequence[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))
    return ordered[rank]


def _replay_mode(
    bios: Sequence[TraceBio],
    mode: DispatchMode,
    profile: EngineProfile,
    device: DeviceModel,
    config: ReplayConfig,
) -> dict[str, Any]:
    depth = config.queue_depth or device.queue_depth
    run = _Run(
        mode,
        profile,
        device,
        model_spec(config.cipher),
        config,
        _Timeline([0.0] * depth, DeviceState(device)),
    )
    queue = _drive(run, bios)
    if run.error is not None:
        raise run.error
    stats = queue.stats.snapshot()
    line = run.timeline
    latencies = [done - issued for done, issued in zip(run.completed, run.issued, strict=True)]
    began = min(run.issued, default=0.0)
    elapsed = max(run.completed, default=0.0) - began
    total = sum(bio.nr_sectors for bio in bios) * SECTOR_SIZE
    by_op: dict[Op, list[int]] = {Op.READ: [], Op.WRITE: []}
    for rq in run.requests:
        by_op[rq.op].append(rq.nr_sectors * SECTOR_SIZE)
    requests = len(run.requests)

    def avg_kib(sizes: list[int]) -> float:
        return round(sum(sizes) / len(sizes) / 1024, 1) if sizes else 0.0

    return {
        "dispatch_mode": mode,
        "engine": profile.name,
        "engine_measured": False,
        "device_model": device.name,
        "cipher": config.cipher,
        "sector_size": config.sector_size,
        "bulk_applies": profile.capabilities.derives_iv(run.spec),
        "rw": "replay",
        "bs": round(total / len(bios)) if bios else 0,
        "iodepth": config.iodepth if config.loop == "closed" else None,
        "numjobs": 1,
        "loop": config.loop,
        "bytes": total,
        "measured_mb_s": None,
        "modelled_mb_s": round(total / elapsed * 1e3, 3) if elapsed > 0 else None,
        "iops": round(len(bios) / elapsed * 1e9, 1) if elapsed > 0 else None,
        "p50_ms": round(_percentile(latencies, 0.50) / 1e6, 4),
        "p90_ms": round(_percentile(latencies, 0.90) / 1e6, 4),
        "p99_ms": round(_percentile(latencies, 0.99) / 1e6, 4),
        "max_ms": round(max(latencies, default=0.0) / 1e6, 4),
        "bios": len(bios),
        "requests": requests,
        "merges": stats["back_merges"] + stats["front_merges"] + stats["request_merges"],
        "back_merges": stats["back_merges"],
        "front_merges": stats["front_merges"],
        "request_merges": stats["request_merges"],
        "engine_calls": line.engine_calls,
        "bulk_calls": line.bulk_calls,
        "unit_calls": line.unit_calls,
        "engine_calls_per_bio": round(line.engine_calls / len(bios), 4) if bios else 0.0,
        "avg_request_kib": avg_kib([size for sizes in by_op.values() for size in sizes]),
        "rareq_sz": avg_kib(by_op[Op.READ]),
        "wareq_sz": avg_kib(by_op[Op.WRITE]),
        "modelled_ms": round(elapsed / 1e6, 3),
        "crypto_ms": round(line.crypto_ns / 1e6, 3),
        "storage_ms": round(line.storage_ns / 1e6, 3),
        "device_ios": requests,
        "write_regime": "+".join(
            regime
            for regime, nbytes in (
                ("burst", line.device.burst_bytes),
                ("sustained", line.device.sustained_bytes),
            )
            if nbytes > 0
        )
        or None,
        "modelled_basis": "replay",
    }


def _without_bulk(profile: EngineProfile) -> EngineProfile:
    """Stock dm-crypt's view of the engine: one data unit per call."""
    caps = replace(profile.capabilities, bulk_ivmodes=frozenset(), keyed_iv=False)
    return replace(profile, name=f"{profile.name} (no bulk)", capabilities=caps)


def _gain(base: dict[str, Any], other: dict[str, Any]) -> float | None:
    low, high = base["modelled_mb_s"], other["modelled_mb_s"]
    return None if not low or high is None else high / low - 1.0


def replay(
    trace: ParsedTrace, profile: EngineProfile, device: DeviceModel, config: ReplayConfig
) -> dict[str, Any]:
    """Cells for bio and request mode (with the engine as it is, and without bulk if it has
    it), the predicted gains, and what the parse skipped."""
    config.validate()
    if not trace.bios:
        raise InvalidInput(
            f"the trace has no read or write bios ({trace.bad.count} bad lines, "
            f"{trace.skipped} other events)"
        )
    unsupported = profile.capabilities.unsupported_reason(
        model_spec(config.cipher), config.sector_size
    )
    if unsupported is not None:
        raise InvalidInput(f"engine {profile.name} cannot run this volume: {unsupported}")
    profiles = [profile]
    if profile.capabilities.derives_iv(model_spec(config.cipher)):
        profiles.append(_without_bulk(profile))
    cells: list[dict[str, Any]] = []
    for engine in profiles:
        for mode in ("bio", "request"):
            cell = _replay_mode(trace.bios, mode, engine, device, config)
            cell["n"] = len(cells)
            cells.append(cell)
    bio, request = cells[0], cells[1]
    gains: dict[str, float | None] = {"request_vs_bio": _gain(bio, request)}
    gains["bulk_vs_per_unit"] = _gain(cells[3], request) if len(cells) == 4 else 0.0
    gains["request_bulk_vs_stock"] = _gain(cells[-2], request)
    return {
        "trace": trace.to_dict(),
        "cells": cells,
        "gains": gains,
        "bulk_fallback_reason": profile.capabilities.fallback_reason(model_spec(config.cipher)),
    }


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:+.1f}%"


def render_report(result: dict[str, Any]) -> str:
    """Markdown: one row per mode and engine, then the predicted gains and the parse."""
    rows = [
        "| mode | engine | MB/s | IOPS | engine calls/bio | wareq_sz | rareq_sz "
        "| merges | p50 ms | p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in result["cells"]:
        rows.append(
            f"| {cell['dispatch_mode']} | {cell['engine']} | {cell['modelled_mb_s'] or 0:.2f} "
            f"| {cell['iops'] or 0:.0f} | {cell['engine_calls_per_bio']:.2f} "
            f"| {cell['wareq_sz']:.1f} | {cell['rareq_sz']:.1f} | {cell['merges']} "
            f"| {cell['p50_ms']:.3f} | {cell['p99_ms']:.3f} |"
        )
    gains = result["gains"]
    trace = result["trace"]
    rows += [
        "",
        f"request mode vs bio mode: {_pct(gains['request_vs_bio'])}; "
        f"bulk vs per-unit calls (request mode): {_pct(gains['bulk_vs_per_unit'])}; "
        f"request + bulk vs stock dm-crypt (bio, per unit): "
        f"{_pct(gains['request_bulk_vs_stock'])}",
        f"trace: {trace['format']}, {trace['bios']} bios, {trace['skipped']} other events "
        f"skipped, {trace['bad_lines']} bad lines",
    ]
    rows += [f"  line {bad['line']}: {bad['text']}" for bad in trace["bad_examples"]]
    return "\n".join(rows) + "\n"
