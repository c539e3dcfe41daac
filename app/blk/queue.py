"""The block queue: split, plug, merge, order, schedule and dispatch bios.

Threading model. Bios arrive from many threads. ``submit_bio`` never waits
for I/O: under one lock it splits the bio to the limits and boundaries, merges
it into a pending request or adds a new request to the shared plug, and
returns. Dispatch runs on submitting threads, as a plug flush runs on the
submitting task in the kernel:

* a thread about to sleep in ``Bio.wait`` whose bio is still plugged becomes
  the plug's flusher (one per plug generation); it waits out the rest of the
  window so other submitters can merge, then moves the plug's requests to the
  elevator and dispatches;
* a submitter that would add a request to a plug already holding
  BLK_MAX_REQUEST_COUNT requests, or whose last request reached
  BLK_PLUG_FLUSH_SIZE, flushes the plug itself first;
* FLUSH, preflush and FUA bios flush the plug and dispatch at once;
* in ``bio`` dispatch mode nothing is plugged or merged.

Whoever moves requests to the elevator, or completes a request, runs the
dispatch loop until no request is ready, calling ``dispatch(request)`` with the
lock released; at most ``queue_depth`` requests are dispatched at once (the
device's tags). A thread takes the ready requests in elevator order as one
batch (a driver's ``queue_rqs``), up to 128 KiB, and dispatches them one after
another; a request that a batch member unblocks is never overtaken by a later
one. ``dispatch`` may return a ``Wait`` instead of finishing the request (a
device with asynchronous I/O): the thread then puts the whole batch on the
device before it waits for each in turn, so the batch's requests overlap.
Batch members are independent (each was ready when taken: no edge joins two
of them), and the batch completes only after every wait returned. With
``set_overlapped`` (a device reached over the network), the thread takes and
dispatches the next ready batch before it waits for the last, as long as tags
are free: its batches are on the device together and complete oldest first.
A request that finds no free tag stays in the elevator, where later bios still merge
into it, and the thread that frees a tag dispatches the next one. A submitter
that needs a new request while ``nr_requests`` are already waiting for a tag
first flushes the plug, then waits for one to be dispatched (not while the
queue is held).

Ordering. When a request is created it records every pending request that
overlaps it where either side writes (and, for FLUSH or preflush, every
pending write request); it is dispatched only after those complete. A bio
that overlaps a pending conflicting request never merges, so later bios
never ride along in an earlier request, and dependency edges always point
from newer to older requests: no cycles. Hence overlapping writes reach the
device in submission order, a read sees every write submitted before it,
and a FLUSH reaches the dispatcher only after every write submitted before it
has completed.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from app.blk.bio import DATA_OPS, WRITE_OPS, Bio, bio_endio, bio_split
from app.blk.elevator import Elevator, make_elevator
from app.blk.limits import QueueLimits
from app.blk.merge import (
    MergeStatus,
    MergeType,
    attempt_bio_merge,
    attempt_merge,
    bio_mergeable,
    crosses_boundary,
    next_boundary,
)
from app.blk.plug import BLK_MAX_REQUEST_COUNT, BLK_PLUG_FLUSH_SIZE, Plug
from app.blk.request import Request, RqState, count_phys_segments
from app.blk.stats import QueueStats
from app.blk.trace import TraceBuffer, Tracer
from app.blk.wait import WaitQueue
from app.errors import InvalidInput, Unavailable
from app.vocab import (
    DEFAULT_QUEUE_DEPTH,
    DISPATCH_MODES,
    MAX_QUEUE_DEPTH,
    REQ_OP_FLUSH,
    REQ_OP_READ,
    REQ_OP_WRITE,
    SECTOR_SHIFT,
    DispatchMode,
    ElevatorName,
    Op,
    Wait,
)

Dispatch = Callable[[Request], Wait | None]
"""Performs a request (returns None), or starts it and returns what waits for it."""
_InFlight = tuple[list[Request], list[int], list[Exception | None], list[tuple[int, Wait]]]
"""A dispatched batch whose waits are still to run: requests, done times, statuses, waits."""


#: Overlap index granularity: 2^11 sectors = 1 MiB per bucket.
_CHUNK_SHIFT = 11
#: A dispatching thread stops taking ready requests once its batch holds this much.
_DISPATCH_BATCH_BYTES = 128 * 1024
#: Trace listeners one queue feeds at once: each holds a bounded buffer.
MAX_TRACE_LISTENERS = 4


def _chunks(start: int, end: int) -> range:
    return range(start >> _CHUNK_SHIFT, ((end - 1) >> _CHUNK_SHIFT) + 1)


class _BatchCounts:
    """A batch's bios and new requests by op, accounted to ``QueueStats`` in one call."""

    __slots__ = ("back", "front", "merges", "started")

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.started: dict[Op, int] = {Op.READ: 0, Op.WRITE: 0}
        self.merges: dict[Op, int] = {}
        self.back = self.front = 0

    def merged(self, op: Op, kind: MergeType) -> None:
        self.merges[op] = self.merges.get(op, 0) + 1
        if kind is MergeType.BACK:
            self.back += 1
        else:
            self.front += 1

    def account(self, stats: QueueStats, now: int) -> None:
        """Hand the counts over and start again from zero."""
        started, merges = self.started, self.merges
        if started[Op.READ] or started[Op.WRITE] or merges:
            stats.bios_queued(now, started, merges, self.back, self.front)
            self.clear()


def _is_barrier(bio: Bio) -> bool:
    return bio.op is Op.FLUSH or bio.preflush or bio.fua


def _trace_completions(
    tracer: Tracer, batch: list[Request], done: list[int], statuses: list[Exception | None]
) -> None:
    """C events: status 0, or -5 (EIO) for a request that failed."""
    for rq, when, status in zip(batch, done, statuses, strict=True):
        tracer.request(
            when, "C", rq.op, rq.sector, rq.nr_sectors, rq.fua, "0" if status is None else "-5"
        )


class BlockQueue:
    """One volume's request queue; every method is thread-safe."""

    def __init__(
        self,
        dispatch: Dispatch,
        *,
        limits: QueueLimits,
        boundaries: Sequence[int] = (),
        dispatch_mode: DispatchMode = "request",
        elevator: ElevatorName = "none",
        plug_window_us: int = 50,
        queue_depth: int = DEFAULT_QUEUE_DEPTH,
        stats: QueueStats | None = None,
    ) -> None:
        if plug_window_us < 0:
            raise InvalidInput("plug_window_us must not be negative")
        self._check_mode(dispatch_mode)
        self._check_queue_depth(queue_depth)
        self._queue_depth = queue_depth
        self._dispatch = dispatch
        self._limits = limits.validate()
        self._boundaries = tuple(sorted(set(boundaries)))
        self._mode: DispatchMode = dispatch_mode
        self._elevator: Elevator = make_elevator(elevator)
        self._window_ns = plug_window_us * 1000
        self.stats = stats if stats is not None else QueueStats()
        self._lock = threading.Lock()
        self._cond = WaitQueue(self._lock)
        self._plug = Plug()
        # Merge candidates by (op, end sector) and (op, start sector) — the rq hash.
        self._by_end: dict[tuple[Op, int], Request] = {}
        self._by_start: dict[tuple[Op, int], Request] = {}
        self._last_merge: Request | None = None
        # Pending requests by 1 MiB chunk, to find overlaps quickly.
        self._overlap: dict[int, set[Request]] = {}
        self._pending: dict[Request, None] = {}
        self._dispatching = 0
        # Requests created and not yet dispatched or absorbed: what nr_requests bounds.
        self._scheduled = 0
        self._held = False
        self._overlapped = False
        #: None unless someone listens (``listen``): every trace hook tests only this.
        self.tracer: Tracer | None = None

    # ---------------------------------------------------------------- tuning

    @staticmethod
    def _check_mode(mode: str) -> None:
        if mode not in DISPATCH_MODES:
            raise InvalidInput("dispatch_mode must be 'bio' or 'request'")

    @staticmethod
    def _check_queue_depth(depth: int) -> None:
        if not 1 <= depth <= MAX_QUEUE_DEPTH:
            raise InvalidInput(f"queue_depth must be between 1 and {MAX_QUEUE_DEPTH}")

    @property
    def queue_depth(self) -> int:
        return self._queue_depth

    @property
    def limits(self) -> QueueLimits:
        return self._limits

    @property
    def boundaries(self) -> tuple[int, ...]:
        return self._boundaries

    @property
    def dispatch_mode(self) -> DispatchMode:
        return self._mode

    @property
    def elevator(self) -> ElevatorName:
        return self._elevator.name

    @property
    def plug_window_us(self) -> int:
        return self._window_ns // 1000

    @property
    def in_flight(self) -> int:
        """Requests accepted and not yet completed (plugged, queued or dispatched)."""
        return len(self._pending)

    def set_dispatch_mode(self, mode: DispatchMode) -> None:
        self._check_mode(mode)
        with self._lock:
            self._mode = mode
            self._flush_plug_locked()
        self._run_queue()

    def set_queue_depth(self, depth: int) -> None:
        """New tag count; requests already on the device finish as they are."""
        self._check_queue_depth(depth)
        with self._lock:
            self._queue_depth = depth
        self._run_queue()

    def set_overlapped(self, overlapped: bool) -> None:
        """Whether a dispatching thread puts its next batch on the device before it
        waits for the last (a device whose I/O waits on the network)."""
        self._overlapped = overlapped

    def set_limits(self, limits: QueueLimits) -> None:
        """New limits apply to later merges; pending requests are flushed as they are."""
        limits.validate()
        with self._lock:
            self._limits = limits
            self._flush_plug_locked()
            self._cond.notify_all()
        self._run_queue()

    def set_boundaries(self, boundaries: Sequence[int]) -> None:
        """Replace merge boundaries; call while suspended, pending requests are not re-split."""
        with self._lock:
            self._boundaries = tuple(sorted(set(boundaries)))
            self._flush_plug_locked()
        self._run_queue()

    def set_elevator(self, name: ElevatorName) -> None:
        elevator = make_elevator(name)
        now = time.perf_counter_ns()
        with self._lock:
            for rq in self._elevator.requests():
                rq.fifo_deadline = 0
                elevator.insert(rq, now)
            self._elevator = elevator
        self._run_queue()

    def set_plug_window(self, plug_window_us: int) -> None:
        if plug_window_us < 0:
            raise InvalidInput("plug_window_us must not be negative")
        with self._lock:
            self._window_ns = plug_window_us * 1000
            self._cond.notify_all()

    # ----------------------------------------------------------------- trace

    def listen(self, capacity: int | None = None, expires: float | None = None) -> TraceBuffer:
        """A new trace listener (blktrace); raises Unavailable past MAX_TRACE_LISTENERS.

        ``expires`` (``time.monotonic()``) lets a listener whose reader vanished without
        ``unlisten`` be dropped by the next ``listen``.
        """
        buffer = (
            TraceBuffer(expires=expires) if capacity is None else TraceBuffer(capacity, expires)
        )
        now = time.monotonic()
        with self._lock:
            current = self.tracer.buffers if self.tracer is not None else ()
            current = tuple(
                listener
                for listener in current
                if listener.expires is None or listener.expires > now
            )
            if len(current) >= MAX_TRACE_LISTENERS:
                raise Unavailable(
                    f"{len(current)} traces already run on this volume; at most "
                    f"{MAX_TRACE_LISTENERS}",
                    retry_after=5,
                )
            self.tracer = Tracer((*current, buffer))
        return buffer

    def unlisten(self, buffer: TraceBuffer) -> None:
        with self._lock:
            current = self.tracer.buffers if self.tracer is not None else ()
            rest = tuple(listener for listener in current if listener is not buffer)
            self.tracer = Tracer(rest) if rest else None

    # ------------------------------------------------------------ submission

    def _validate(self, bio: Bio) -> None:
        if bio.op is Op.FLUSH:
            if bio.nr_sectors or bio.segments:
                raise InvalidInput("a flush carries no data")
            return
        block = self._limits.logical_block_sectors
        if bio.sector < 0 or bio.nr_sectors <= 0:
            raise InvalidInput("bio must cover at least one sector at a non-negative sector")
        if bio.sector % block or bio.nr_sectors % block:
            raise InvalidInput(
                f"bio not aligned to the {self._limits.logical_block_size}-byte logical block"
            )
        if bio.op in DATA_OPS:
            size = 0
            for segment in bio.segments:
                size += segment.nbytes
            if size != bio.nr_sectors << SECTOR_SHIFT:
                raise InvalidInput(f"payload is {size} bytes, bio covers {bio.nr_bytes}")
        elif bio.segments:
            raise InvalidInput(f"{bio.op} bio carries no payload")

    def _segment_sectors(self, bio: Bio) -> int:
        """Sectors from the bio's start that fit in ``max_segments`` physical segments."""
        limits = self._limits
        budget = limits.max_segments
        size = 0
        for segment in bio.segments:
            pieces = count_phys_segments([segment], limits.max_segment_size)
            if pieces > budget:
                size += budget * limits.max_segment_size
                break
            budget -= pieces
            size += segment.nbytes
        block = limits.logical_block_sectors
        sectors = (size >> SECTOR_SHIFT) // block * block
        return max(block, sectors)

    def _split_to_limits(self, bio: Bio) -> list[Bio]:
        """bio_split_to_limits, plus splitting at merge boundaries."""
        if bio.op is Op.FLUSH:
            return [bio]
        limits = self._limits
        segments = bio.segments
        if (
            not self._boundaries
            and len(segments) <= 1
            and (not segments or segments[0].nbytes <= limits.max_segment_size)
            and bio.nr_sectors <= limits.max_sectors
        ):
            return [bio]  # one physical segment at most, within every limit: nothing to cut
        pieces: list[Bio] = []
        current = bio
        while True:
            cut = limits.max_sectors
            boundary = next_boundary(current.sector, self._boundaries)
            if boundary is not None:
                cut = min(cut, boundary - current.sector)
            if current.segments and (
                len(current.segments) > limits.max_segments
                or count_phys_segments(current.segments, limits.max_segment_size)
                > limits.max_segments
            ):
                cut = min(cut, self._segment_sectors(current))
            if current.nr_sectors <= cut:
                pieces.append(current)
                return pieces
            front, current = bio_split(current, cut)
            pieces.append(front)

    def submit_bio(self, bio: Bio) -> None:
        """Queue ``bio``; its completion is observed with ``bio.wait()``.

        Raises InvalidInput for a malformed bio. Never waits for I/O, but may
        dispatch on this thread when it flushes the plug (thresholds, barriers,
        ``bio`` mode).
        """
        self._validate(bio)
        now = time.perf_counter_ns()
        if not bio.submit_time:
            bio.submit_time = now
        pieces = self._split_to_limits(bio)
        with self._lock:
            run = self._place_locked(bio, pieces, now)
        if run:
            self._run_queue()

    def _place_locked(self, bio: Bio, pieces: list[Bio], now: int) -> bool:
        """Queue a bio's pieces; a split parent learns their plug. True: run the queue."""
        run = False
        generation = -1
        for piece in pieces:
            piece.unplug = self._unplug
            run |= self._queue_bio(piece, now)
            generation = max(generation, piece.plug_generation)
        parent = bio if len(pieces) > 1 else None
        while parent is not None:
            parent.unplug = self._unplug
            parent.plug_generation = max(parent.plug_generation, generation)
            parent = parent.parent
        return run

    def submit_bios(self, bios: Sequence[Bio]) -> None:
        """Queue several bios at once, then flush the plug (io_submit under one plug).

        Raises InvalidInput before queueing anything if any bio is malformed. Decides
        exactly as ``submit_bio`` of each in turn would, under one lock round.
        """
        block_mask = self._limits.logical_block_sectors - 1
        for bio in bios:
            segments = bio.segments
            # The common valid shape, checked inline; ``_validate`` names any fault.
            if not (
                bio.op in DATA_OPS
                and len(segments) == 1
                and bio.sector >= 0
                and bio.nr_sectors > 0
                and not (bio.sector | bio.nr_sectors) & block_mask
                and segments[0].nbytes == bio.nr_sectors << SECTOR_SHIFT
            ):
                self._validate(bio)
        now = time.perf_counter_ns()
        with self._lock:
            if self.tracer is None and self._mode == "request":
                self._place_batch_locked(bios, now)
            else:
                for bio in bios:
                    if not bio.submit_time:
                        bio.submit_time = now
                    self._place_locked(bio, self._split_to_limits(bio), now)
            self._flush_plug_locked(now)
        self._run_queue()

    def _place_batch_locked(self, bios: Sequence[Bio], now: int) -> None:
        """``_place_locked`` of each bio in request mode with no tracer, its statistics
        counted once for the batch.

        A read or write that needs no split and finds a request slot is placed
        here, with ``_queue_bio``'s decisions inline (merge attempts only when a
        candidate is adjacent: otherwise ``_attempt_merges`` finds nothing); any other
        bio goes through ``_place_locked`` after the batch's counts are accounted,
        since it may wait for a slot with the lock dropped.
        """
        limits = self._limits
        max_sectors = limits.max_sectors
        max_segment_size = limits.max_segment_size
        nomerges = limits.nomerges
        nr_requests = limits.nr_requests
        boundaries = self._boundaries
        unplug = self._unplug
        plug = self._plug
        pending = self._pending
        overlap = self._overlap
        by_end, by_start = self._by_end, self._by_start
        counts = _BatchCounts()
        for bio in bios:
            if not bio.submit_time:
                bio.submit_time = now
            op, sector, nr_sectors, segments = bio.op, bio.sector, bio.nr_sectors, bio.segments
            if not (
                (op is REQ_OP_READ or op is REQ_OP_WRITE)
                and not (bio.fua or bio.preflush or bio.no_merge)
                and len(segments) == 1
                and segments[0].nbytes <= max_segment_size
                and nr_sectors <= max_sectors
                and (
                    not boundaries or not crosses_boundary(sector, sector + nr_sectors, boundaries)
                )
                and (self._held or self._scheduled < nr_requests)
            ):
                counts.account(self.stats, now)
                self._place_locked(bio, self._split_to_limits(bio), now)
                continue
            bio.unplug = unplug
            end = sector + nr_sectors
            conflicts: list[Request] = []
            if pending:
                first, last = sector >> _CHUNK_SHIFT, (end - 1) >> _CHUNK_SHIFT
                if first != last:
                    conflicts = self._conflicts(bio)
                else:
                    bucket = overlap.get(first)
                    if bucket:
                        writes = op is REQ_OP_WRITE
                        conflicts = [
                            rq
                            for rq in bucket
                            if rq.sector < end
                            and sector < rq.sector + rq.nr_sectors
                            and (writes or rq.op in WRITE_OPS)
                        ]
            if not conflicts and nomerges != 2:
                if nomerges == 0 and ((op, sector) in by_end or (op, end) in by_start):
                    adjacent = True
                else:
                    adjacent = False
                    for rq in (self._last_merge, plug.last):
                        if rq is not None and (
                            rq.sector + rq.nr_sectors == sector or rq.sector == end
                        ):
                            adjacent = True
                            break
                if adjacent:
                    merged = self._attempt_merges(bio, now)
                    if merged is not None:
                        counts.merged(op, merged)
                        continue
            # start_time stored, not passed: a keyword makes the class call build a dict.
            rq = Request(op, sector, nr_sectors, [bio], [segments[0]], 1)
            rq.start_time = now
            for earlier in conflicts:
                earlier.dependents.append(rq)
                earlier.ordered = True
                rq.wait_count += 1
                rq.ordered = True
            pending[rq] = None
            self._scheduled += 1
            first, last = sector >> _CHUNK_SHIFT, (end - 1) >> _CHUNK_SHIFT
            if first != last:
                self._index(rq, sector, end)
            else:
                bucket = overlap.get(first)
                if bucket is None:
                    overlap[first] = {rq}
                else:
                    bucket.add(rq)
            counts.started[op] += 1
            requests = plug.requests
            last_rq = plug.last
            if requests and (  # Plug.needs_flush
                len(requests) >= BLK_MAX_REQUEST_COUNT
                or (
                    last_rq is not None
                    and last_rq.nr_sectors << SECTOR_SHIFT >= BLK_PLUG_FLUSH_SIZE
                )
            ):
                self._flush_plug_locked(now)
                requests = plug.requests
            if not requests:
                plug.open_time = now
            requests.append(rq)
            plug.last = rq
            bio.plug_generation = plug.generation
            by_end[(op, end)] = rq
            by_start[(op, sector)] = rq
        counts.account(self.stats, now)

    def submit_and_wait(self, bio: Bio, timeout: float | None = None) -> None:
        """Submit and block until done; raises the bio's error or TimeoutError."""
        self.submit_bio(bio)
        bio.wait(timeout)

    def flush(self, timeout: float | None = None) -> None:
        """Issue a FLUSH and wait: every write completed or submitted before is durable."""
        self.submit_and_wait(Bio(Op.FLUSH, 0, 0), timeout)

    # ------------------------------------------------ placement (lock held)

    def _conflicts(self, bio: Bio) -> list[Request]:
        """Pending requests ``bio`` must wait for (see the module docstring)."""
        if bio.op is Op.FLUSH or bio.preflush:
            found = [rq for rq in self._pending if rq.op in WRITE_OPS]
            if bio.op is Op.FLUSH:
                return found
        else:
            found = []
        writes = bio.op in WRITE_OPS
        start, end = bio.sector, bio.sector + bio.nr_sectors
        seen: set[Request] = set()
        for chunk in _chunks(start, end):
            for rq in self._overlap.get(chunk, ()):
                if (
                    rq not in seen
                    and rq.sector < end
                    and start < rq.sector + rq.nr_sectors
                    and (writes or rq.op in WRITE_OPS)
                ):
                    seen.add(rq)
                    if not (bio.preflush and rq.op in WRITE_OPS):
                        found.append(rq)
        return found

    def _index(self, rq: Request, start: int, end: int) -> None:
        overlap = self._overlap
        for chunk in _chunks(start, end):
            bucket = overlap.get(chunk)
            if bucket is None:
                overlap[chunk] = {rq}
            else:
                bucket.add(rq)

    def _unindex(self, rq: Request) -> None:
        overlap = self._overlap
        for chunk in _chunks(rq.sector, rq.sector + rq.nr_sectors):
            bucket = overlap.get(chunk)
            if bucket is not None:
                bucket.discard(rq)
                if not bucket:
                    del overlap[chunk]

    def _hash_add(self, rq: Request) -> None:
        self._by_end[(rq.op, rq.sector + rq.nr_sectors)] = rq
        self._by_start[(rq.op, rq.sector)] = rq

    def _hash_del(self, rq: Request) -> None:
        key = (rq.op, rq.sector + rq.nr_sectors)
        if self._by_end.get(key) is rq:
            del self._by_end[key]
        key = (rq.op, rq.sector)
        if self._by_start.get(key) is rq:
            del self._by_start[key]

    def _queue_bio(self, bio: Bio, now: int) -> bool:
        """Place one (already split) bio; True if the caller must run the dispatch loop.

        May drop and retake the lock while it waits for a request slot; placement
        is then decided again, since pending requests may have completed meanwhile.
        """
        tracer = self.tracer
        if tracer is not None:
            tracer.bio(now, "Q", bio.op, bio.sector, bio.nr_sectors, bio.fua)
        while True:
            conflicts = self._conflicts(bio) if self._pending else []
            if (
                not conflicts
                and self._mode == "request"
                and self._limits.nomerges != 2
                and bio_mergeable(bio)
            ):
                merged = self._attempt_merges(bio, now)
                if merged is not None:
                    self.stats.account_bio(bio.op, merged.value)
                    if tracer is not None:
                        action = "M" if merged is MergeType.BACK else "F"
                        tracer.bio(now, action, bio.op, bio.sector, bio.nr_sectors, bio.fua)
                    return False
            if self._held or self._scheduled < self._limits.nr_requests:
                break
            self._wait_for_request_slot()
        rq = Request.from_bio(bio, self._limits.max_segment_size, now)
        tracer = self.tracer  # a listener may have come while this thread waited for a slot
        if tracer is not None:
            rq.tracer = tracer
            tracer.bio(now, "G", bio.op, bio.sector, bio.nr_sectors, bio.fua)
        for earlier in conflicts:
            earlier.dependents.append(rq)
            earlier.ordered = True
            rq.wait_count += 1
            rq.ordered = True
        self._pending[rq] = None
        self._scheduled += 1
        if bio.op is not Op.FLUSH:
            self._index(rq, rq.sector, rq.sector + rq.nr_sectors)
        self.stats.request_started(now, bio.op)
        if _is_barrier(bio) or self._mode == "bio":
            if _is_barrier(bio):
                # Nothing submitted later may join a request from before the barrier.
                for pending in self._pending:
                    if pending.state <= RqState.QUEUED:
                        pending.no_merge = True
            self._flush_plug_locked(now)
            rq.state = RqState.QUEUED
            self._elevator.insert(rq, now)
            if tracer is not None:
                tracer.request(now, "I", rq.op, rq.sector, rq.nr_sectors, rq.fua, "")
            return True
        run = False
        plug = self._plug
        if plug.requests and plug.needs_flush():
            self._flush_plug_locked(now)
            run = True
        if tracer is not None and not plug.requests:
            tracer.emit(now, "P", "N", 0, 0)
        plug.add_request(rq, now)
        bio.plug_generation = plug.generation
        self._hash_add(rq)
        return run

    def _wait_for_request_slot(self) -> None:
        """Lock held: send what is plugged towards the device, then sleep until a
        request leaves the scheduler (blk_mq_get_tag sleeping on the sched tags)."""
        self._flush_plug_locked()
        self._lock.release()
        try:
            self._run_queue()
        finally:
            self._lock.acquire()
        while self._scheduled >= self._limits.nr_requests and not self._held:
            self._cond.wait()

    def _attempt_merges(self, bio: Bio, now: int) -> MergeType | None:
        """Plug merge on the last request, then the rq hash (nomerges=0 only)."""
        candidates: list[Request | None] = [self._last_merge, self._plug.last]
        if self._limits.nomerges == 0:
            candidates.append(self._by_end.get((bio.op, bio.sector)))
            candidates.append(self._by_start.get((bio.op, bio.sector + bio.nr_sectors)))
        tried: list[Request] = []
        for rq in candidates:
            if rq is None or rq.state > RqState.QUEUED or rq in tried:
                continue
            if rq.sector + rq.nr_sectors != bio.sector and rq.sector != bio.sector + bio.nr_sectors:
                continue  # not adjacent: attempt_bio_merge could only say NONE
            tried.append(rq)
            old_sector, old_end = rq.sector, rq.sector + rq.nr_sectors
            status, kind = attempt_bio_merge(rq, bio, self._limits, self._boundaries)
            if status is MergeStatus.FAILED:
                self._hash_del(rq)
                continue
            if status is not MergeStatus.OK:
                continue
            self._after_bio_merge(rq, bio, kind, old_sector, old_end, now)
            return kind
        return None

    def _after_bio_merge(
        self, rq: Request, bio: Bio, kind: MergeType, old_sector: int, old_end: int, now: int
    ) -> None:
        self._last_merge = rq
        self._index(rq, bio.sector, bio.sector + bio.nr_sectors)
        if self._by_end.get((rq.op, old_end)) is rq:
            del self._by_end[(rq.op, old_end)]
        if self._by_start.get((rq.op, old_sector)) is rq:
            del self._by_start[(rq.op, old_sector)]
        self._hash_add(rq)
        if kind is MergeType.FRONT and rq.state is RqState.QUEUED:
            self._elevator.front_merged(rq, old_sector)
        bio.plug_generation = self._plug.generation if rq.state is RqState.PLUGGED else -1
        if self._limits.nomerges:
            return
        # The bio may have closed the gap to a neighbour (attempt_back/front_merge).
        if kind is MergeType.BACK:
            neighbour = self._by_start.get((rq.op, rq.sector + rq.nr_sectors))
            if neighbour is not None:
                self._merge_requests(rq, neighbour, now)
        else:
            neighbour = self._by_end.get((rq.op, rq.sector))
            if neighbour is not None:
                self._merge_requests(neighbour, rq, now)

    def _merge_requests(self, rq: Request, next_rq: Request, now: int) -> None:
        if rq.state is not next_rq.state or rq.state > RqState.QUEUED:
            return
        old_end = rq.sector + rq.nr_sectors
        self._hash_del(rq)
        self._hash_del(next_rq)
        if not attempt_merge(rq, next_rq, self._limits, self._boundaries):
            self._hash_add(rq)
            self._hash_add(next_rq)
            return
        if rq.state is RqState.PLUGGED:
            self._plug.remove(next_rq)
            for bio in next_rq.bios:
                bio.plug_generation = self._plug.generation
        else:
            self._elevator.remove(next_rq)
        self._unindex(next_rq)
        self._index(rq, old_end, rq.sector + rq.nr_sectors)
        del self._pending[next_rq]
        self._scheduled -= 1
        next_rq.state = RqState.DONE
        if self._last_merge is next_rq:
            self._last_merge = rq
        self._hash_add(rq)
        self.stats.request_absorbed(next_rq.op, now)

    def _flush_plug_locked(self, now: int | None = None) -> bool:
        """Move the plug's requests to the elevator; True if there were any."""
        if not self._plug.requests:
            return False
        if now is None:
            now = time.perf_counter_ns()
        requests = self._plug.finish_plug()
        tracer = self.tracer
        if tracer is not None:
            tracer.emit(now, "U", "N", 0, 0, str(len(requests)))
        queued, insert = RqState.QUEUED, self._elevator.insert  # once, not per request
        for rq in requests:
            rq.state = queued
            insert(rq, now)
            if tracer is not None:
                tracer.request(now, "I", rq.op, rq.sector, rq.nr_sectors, rq.fua, "")
        self._cond.notify_all()
        return True

    # ---------------------------------------------------------------- unplug

    def _unplug(self, bio: Bio, deadline: float | None) -> None:
        """Called by a waiter: flush the plug holding ``bio`` once its window ends."""
        with self._lock:
            plug = self._plug
            generation = bio.plug_generation
            if generation != plug.generation or not plug.requests or plug.flusher:
                return
            plug.flusher = True
            while True:
                if plug.generation != generation:
                    return
                remaining_ns = plug.open_time + self._window_ns - time.perf_counter_ns()
                if remaining_ns <= 0:
                    break
                timeout = remaining_ns / 1e9
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        plug.flusher = False
                        return
                    timeout = min(timeout, left)
                self._cond.wait(timeout)
            self._flush_plug_locked()
        self._run_queue()

    def finish_plug(self) -> None:
        """Flush the plug now and dispatch (blk_finish_plug)."""
        with self._lock:
            self._flush_plug_locked()
        self._run_queue()

    # -------------------------------------------------------------- dispatch

    @staticmethod
    def _ready(rq: Request) -> bool:
        return rq.wait_count == 0

    def _run_queue(self) -> None:
        """Dispatch ready requests until none is left (blk_mq_run_hw_queue).

        Ready requests are taken a batch at a time (``_take_ready``) and dispatched
        one after another on this thread, as a driver's ``queue_rqs`` takes a plug's
        list: one lock round and one statistics update per batch, not per request;
        then the waits of those that went to the device asynchronously.
        """
        lock = self._lock
        in_flight: deque[_InFlight] = deque()
        lock.acquire()
        try:
            while True:
                batch = self._take_ready()
                if batch:
                    lock.release()
                    done = [0] * len(batch)
                    statuses: list[Exception | None] = [None] * len(batch)
                    waits: list[tuple[int, Wait]] = []
                    for index, rq in enumerate(batch):
                        try:
                            wait = self._dispatch(rq)
                        except Exception as error:
                            statuses[index] = error
                            wait = None
                        if wait is None:
                            done[index] = time.perf_counter_ns()
                        else:
                            waits.append((index, wait))
                    if waits and self._overlapped:
                        in_flight.append((batch, done, statuses, waits))
                        lock.acquire()
                        continue
                elif in_flight:
                    lock.release()
                    batch, done, statuses, waits = in_flight.popleft()
                else:
                    break
                for index, wait in waits:
                    try:
                        wait()
                    except Exception as error:
                        statuses[index] = error
                    done[index] = time.perf_counter_ns()
                # Accounted before the bios end: whoever sees its I/O done sees it counted.
                self.stats.requests_done(batch, done)
                tracer = self.tracer
                if tracer is not None:
                    _trace_completions(tracer, batch, done, statuses)
                for rq, status in zip(batch, statuses, strict=True):
                    for bio in rq.bios:  # rq.complete(status), without a call per request
                        bio_endio(bio, status)
                lock.acquire()
                self._dispatching -= len(batch)
                pending = self._pending
                overlap = self._overlap
                done_state = RqState.DONE
                for rq in batch:
                    rq.state = done_state
                    del pending[rq]
                    if rq.op is not REQ_OP_FLUSH:
                        chunk = rq.sector >> _CHUNK_SHIFT
                        if chunk == (rq.sector + rq.nr_sectors - 1) >> _CHUNK_SHIFT:
                            bucket = overlap.get(chunk)
                            if bucket is not None:
                                bucket.discard(rq)
                                if not bucket:
                                    del overlap[chunk]
                        else:
                            self._unindex(rq)
                    for dependent in rq.dependents:
                        dependent.wait_count -= 1
                    rq.dependents = []
                self._cond.notify_all()
        finally:
            lock.release()

    def _take_ready(self) -> list[Request]:
        """Lock held: move ready requests to dispatch, one per free tag, until the batch
        holds ``_DISPATCH_BATCH_BYTES`` (``Elevator.dispatch_batch``); a big request goes
        alone, so that another thread dispatches the next one beside it."""
        now = time.perf_counter_ns()
        if self._held or self._dispatching >= self._queue_depth:
            return []
        batch = self._elevator.dispatch_batch(
            now, self._ready, self._queue_depth - self._dispatching, _DISPATCH_BATCH_BYTES
        )
        if not batch:
            return batch
        by_end, by_start = self._by_end, self._by_start
        dispatched = RqState.DISPATCHED
        for rq in batch:
            rq.state = dispatched
            key = (rq.op, rq.sector + rq.nr_sectors)
            if by_end.get(key) is rq:
                del by_end[key]
            key = (rq.op, rq.sector)
            if by_start.get(key) is rq:
                del by_start[key]
            if self._last_merge is rq:
                self._last_merge = None
        self._scheduled -= len(batch)
        self._dispatching += len(batch)
        self.stats.requests_dispatched(batch, now)
        tracer = self.tracer
        if tracer is not None:
            for rq in batch:
                tracer.request(now, "D", rq.op, rq.sector, rq.nr_sectors, rq.fua, "")
        self._cond.notify_all()
        return batch

    # ------------------------------------------------------- suspend/resume

    def hold(self) -> None:
        """Stop dispatching: new bios are accepted and queued, not dispatched."""
        with self._lock:
            self._held = True
            self._cond.notify_all()

    def release(self) -> None:
        """Resume dispatching; queued requests go out on a short-lived thread so
        the caller (a resume holding volume locks) never runs target code itself."""
        with self._lock:
            self._held = False
            self._flush_plug_locked()
            pending = len(self._elevator) > 0
        if pending:
            threading.Thread(target=self._run_queue, name="blk-release", daemon=True).start()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait for outstanding I/O; True when done, False on timeout.

        Not held: flushes the plug and waits until no request is pending
        (drain then hold = suspend). Held: waits only for requests already in
        dispatch (hold then drain = noflush suspend).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._held:
            self.finish_plug()
        with self._lock:
            while self._dispatching if self._held else self._pending:
                if deadline is None:
                    self._cond.wait()
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True
