"""A volume's data path: byte-range I/O in, bios through the block queue, requests to targets.

Front ends reach it through ``app.io`` and its one batch API, ``submit_batch``
(``start_batch`` is its first half, for an event loop); a stacked volume's
targets use the one-I/O methods (``read_into``, ``write``, ``flush``,
``discard``, ``write_zeroes``). Either way byte offsets of any alignment become
bios of whole logical blocks under one partial-block rule, go through the block
queue (plug, merge, elevator) and reach ``_dispatch``, which hands each request
to the one target it lies in (the queue never lets a request cross a target
boundary). A write with partial edge blocks is a read-modify-write under an
exclusive range lock, so concurrent partial writes to one block never lose each
other; whole-block I/O shares the range.

Every I/O is admitted through one gate: while suspended it waits (bounded by
``suspend_wait_seconds``), and it is counted in flight so suspend can drain.
Past ``lease_deadline`` (a cluster node whose lease on the volume was not
renewed in time) the gate refuses every I/O with ``LeaseExpired``.
The lifecycle (``app.dm.volume``) swaps tables and opens or closes the gate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from typing_extensions import Buffer

from app.blk import mempool
from app.blk.bio import Bio
from app.blk.limits import QueueLimits
from app.blk.queue import BlockQueue
from app.blk.request import Request
from app.blk.stats import QueueStats
from app.blk.tuning import CryptSplit, Tuning
from app.blk.wait import WaitQueue, WouldBlock
from app.dm.generation import Generation, Precondition
from app.dm.rangelock import RangeLock
from app.dm.table import CryptParams, Table
from app.dm.targets import MapContext, MapResult, Target
from app.errors import (
    InvalidInput,
    InvalidState,
    LeaseExpired,
    RangeNotSatisfiable,
    Unavailable,
)
from app.vocab import (
    DEFAULT_QUEUE_DEPTH,
    DISPATCH_MODES,
    REQ_OP_FLUSH,
    REQ_OP_READ,
    REQ_OP_WRITE,
    SECTOR_SIZE,
    Op,
    VolumeState,
    Wait,
    align_down,
    align_up,
    completed,
)

_CONTEXTS = {mode: MapContext(dispatch_mode=mode) for mode in DISPATCH_MODES}


class BlockIo(Protocol):
    """One I/O of a batch as the batch API reads it (``app.io.Io`` is the one front ends
    build): an op at a byte ``offset``, ``length`` bytes, any alignment. ``buffer`` is what
    a read fills and what a write writes (None for the other ops); ``error`` is where its
    failure lands; ``may_overwrite``: a write's buffer may be encrypted in place."""

    op: Op
    offset: int
    length: int
    buffer: memoryview | None
    fua: bool
    error: Exception | None
    may_overwrite: bool


_WRITES = frozenset({Op.WRITE, Op.WRITE_ZEROES, Op.DISCARD})


class StartedBatch:
    """A batch admitted and queued (``DataPath.start_batch``): ``finish`` waits for its bios,
    records each I/O's error, and lets go of the volume (in-flight count, range holds)."""

    __slots__ = ("_hold", "_submitted")

    def __init__(self, submitted: list[tuple[BlockIo, Bio]], hold: ExitStack) -> None:
        self._submitted = submitted
        self._hold = hold

    def done(self) -> bool:
        """Every bio completed: ``finish`` will not wait."""
        return all(bio.done.is_set() for _, bio in self._submitted)

    def finish(self) -> None:
        try:
            for io, bio in self._submitted:
                try:
                    bio.wait()
                except Exception as error:
                    io.error = error
        finally:
            self._hold.close()


@dataclass(slots=True)
class LiveMap:
    """The live table with its constructed targets."""

    table: Table
    targets: list[Target]
    logical_block_size: int
    queue_depth: int = DEFAULT_QUEUE_DEPTH
    """The fewest hardware tags among the modelled devices it maps onto."""
    overlapped: bool = False
    """It maps onto a device that waits on another thread or the network (not a paced
    model's timer): the queue overlaps batches on it (``BlockQueue.set_overlapped``)."""
    size_bytes: int = field(init=False)
    """Kept, not derived: every ranged request asks it on the event loop."""

    def __post_init__(self) -> None:
        self.size_bytes = self.table.size_sectors * SECTOR_SIZE

    def target_at(self, sector: int) -> Target:
        for target in self.targets:
            if target.start <= sector < target.end:
                return target
        raise InvalidInput(f"sector {sector} is beyond the table")


class DataPath:
    """The I/O half of a volume; also what a stacked volume's targets map onto."""

    def __init__(
        self,
        name: str,
        *,
        tuning: Tuning,
        default_plug_window_us: int,
        suspend_wait_seconds: float,
        default_crypt_split: CryptSplit = (None, None),
    ) -> None:
        self.name = name
        self.suspend_wait_seconds = suspend_wait_seconds
        self.state: VolumeState = "suspended"
        self.live: LiveMap | None = None
        self.versions = Generation()
        self.stats = QueueStats()
        self.queue = BlockQueue(
            self._dispatch,
            limits=tuning.limits,
            dispatch_mode=tuning.dispatch_mode,
            elevator=tuning.elevator,
            plug_window_us=tuning.plug_window(default_plug_window_us),
            stats=self.stats,
        )
        self._contexts = _CONTEXTS
        self.set_crypt_split(tuning.crypt_split(default_crypt_split))
        self._ranges = RangeLock()
        self._gate = WaitQueue()
        self._in_flight = 0
        #: ``time.monotonic()`` past which this node may no longer own the volume (a cluster
        #: node's lease, renewed in the background); every I/O checks it when admitted.
        self.lease_deadline = math.inf
        #: The epoch of the lease this node serves the volume under (None: no cluster).
        self.lease_epoch: int | None = None

    def set_crypt_split(self, split: CryptSplit) -> None:
        """dm-crypt's split sizes for the requests dispatched from now on."""
        read, write = split
        self.crypt_split = split
        self._contexts = (
            _CONTEXTS
            if split == (None, None)
            else {mode: MapContext(mode, read, write) for mode in DISPATCH_MODES}
        )

    @property
    def generation(self) -> int:
        return self.versions.value

    def read_versioned(self, read: Callable[[], object], attempts: int = 3) -> int | None:
        """Run ``read`` (again, if a write overlapped it) and return the version its bytes
        belong to; None when writes kept overlapping it."""
        for _ in range(attempts):
            snapshot = self.versions.snapshot()
            read()
            if snapshot is not None and self.versions.unchanged_since(snapshot):
                return snapshot[0]
        return None

    @property
    def limits(self) -> QueueLimits:
        return self.queue.limits

    @property
    def size(self) -> int:
        return self.live.size_bytes if self.live else 0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def _set_state(self, state: VolumeState) -> None:
        """Open or close the gate; waiting I/O re-checks it."""
        with self._gate:
            self.state = state
            self._gate.notify_all()

    def hold_lease_until(self, deadline: float, epoch: int | None = None) -> None:
        """Move the lease deadline; I/O waiting at the gate re-checks it (``-inf``: at once)."""
        with self._gate:
            self.lease_deadline = deadline
            if epoch is not None:
                self.lease_epoch = epoch
            self._gate.notify_all()

    def drain(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._gate:
            while self._in_flight:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise Unavailable(
                        f"volume {self.name} still has {self._in_flight} I/Os in flight"
                    )
                self._gate.wait(remaining)

    def _dispatch(self, request: Request) -> Wait | None:
        live = self.live
        if live is None:
            raise InvalidState(f"volume {self.name} has no live table")
        context = self._contexts[self.queue.dispatch_mode]
        if request.op == REQ_OP_FLUSH:
            for target in live.targets:
                target.flush()
            return None
        targets, sector = live.targets, request.sector  # a one-line table needs no search
        only = targets[0] if len(targets) == 1 else None
        if only is not None and only.start <= sector < only.start + only.length:
            finish = only.submit(request, context)
        else:
            finish = live.target_at(sector).submit(request, context)
        stats = self.stats
        if isinstance(finish, MapResult):  # done already: the queue has nothing to wait for
            if finish.engine_calls:
                stats.add_engine_calls(finish.engine_calls, finish.modelled_ns, finish.queue_ns)
            return None

        def wait() -> None:
            done = finish()
            if done.engine_calls:
                stats.add_engine_calls(done.engine_calls, done.modelled_ns, done.queue_ns)

        return wait

    @contextmanager
    def _io(self, *, wait: bool = True) -> Iterator[LiveMap]:
        """Admit one I/O: wait while suspended (bounded), count it in flight.
        ``wait=False``: WouldBlock where it would wait."""
        live = self._admit(wait)
        try:
            yield live
        finally:
            self._release()

    def _admit(self, wait: bool = True) -> LiveMap:
        now = time.monotonic()
        deadline = now + self.suspend_wait_seconds
        with self._gate:
            while self.state != "active" or now >= self.lease_deadline:
                if not wait:
                    raise WouldBlock
                if now >= self.lease_deadline:
                    raise LeaseExpired(
                        f"this node no longer holds the lease on volume {self.name}; "
                        "retry: its owner serves it",
                        retry_after=1,
                    )
                remaining = deadline - now
                if remaining <= 0:
                    raise Unavailable(
                        f"volume {self.name} is suspended; retry after resume",
                        retry_after=max(1, int(self.suspend_wait_seconds)),
                    )
                self._gate.wait(remaining)
                now = time.monotonic()
            live = self.live
            if live is None:
                raise InvalidState(f"volume {self.name} has no live table")
            self._in_flight += 1
        return live

    def _release(self) -> None:
        with self._gate:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._gate.notify_all()

    def check_range(self, offset: int, length: int) -> None:
        size = self.size
        if offset < 0 or length < 0 or offset + length > size:
            raise RangeNotSatisfiable(
                f"range {offset}+{length} is outside the volume ({size} bytes)", size
            )

    def _submit(
        self,
        op: Op,
        offset: int,
        length: int,
        segments: list[memoryview],
        *,
        fua: bool = False,
        may_overwrite: bool = False,
    ) -> None:
        bio = Bio(
            op,
            offset // SECTOR_SIZE,
            length // SECTOR_SIZE,
            segments,
            fua=fua,
            may_overwrite=may_overwrite,
        )
        self.queue.submit_bio(bio)
        bio.wait()

    # ------------------------------------------------- one I/O at a time (stacked use)

    def read_into(self, offset: int, buffer: memoryview) -> None:
        """Read ``len(buffer)`` bytes at ``offset``; any alignment."""
        length = len(buffer)
        self.check_range(offset, length)
        if length == 0:
            return
        with self._io() as live:
            self._read_into(live.logical_block_size, offset, buffer)

    def readv_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        """Stacked use: a whole request of the volume above becomes one bio here."""
        if len(buffers) == 1:
            self.read_into(offset, buffers[0])
            return
        length = sum(len(buffer) for buffer in buffers)
        if not self._aligned(offset, [len(b) for b in buffers]):
            super_buffer = bytearray(length)
            self.read_into(offset, memoryview(super_buffer))
            position = 0
            for buffer in buffers:
                buffer[:] = memoryview(super_buffer)[position : position + len(buffer)]
                position += len(buffer)
            return
        self.check_range(offset, length)
        with self._io(), self._ranges.hold(offset, offset + length, exclusive=False):
            self._submit(Op.READ, offset, length, [memoryview(b) for b in buffers])

    def writev(self, offset: int, buffers: Sequence[Buffer]) -> None:
        views = [memoryview(buffer).cast("B") for buffer in buffers]
        if len(views) == 1:
            self.write(offset, views[0])
            return
        length = sum(len(view) for view in views)
        if not self._aligned(offset, [len(view) for view in views]):
            self.write(offset, b"".join(views))
            return
        self.check_range(offset, length)
        with (
            self._io(),
            self.versions.writing(),
            self._ranges.hold(offset, offset + length, exclusive=False),
        ):
            self._submit(Op.WRITE, offset, length, views)

    def submit_readv(self, offset: int, buffers: Sequence[memoryview]) -> Wait:
        """Stacked use: the volume below runs its own queue; done when this returns."""
        self.readv_into(offset, buffers)
        return completed

    def submit_writev(self, offset: int, buffers: Sequence[Buffer]) -> Wait:
        self.writev(offset, buffers)
        return completed

    def _aligned(self, offset: int, lengths: list[int]) -> bool:
        """Whole logical blocks in every segment: the crypt targets below split no unit."""
        live = self.live
        unit = live.logical_block_size if live else SECTOR_SIZE
        return offset % unit == 0 and all(length % unit == 0 for length in lengths)

    def read(self, offset: int, length: int) -> bytearray:
        buffer = bytearray(length)
        self.read_into(offset, memoryview(buffer))
        return buffer

    def write(
        self,
        offset: int,
        data: Buffer,
        *,
        fua: bool = False,
        precondition: Precondition | None = None,
    ) -> int:
        """Write at ``offset``, any alignment. ``precondition`` is checked atomically with
        the write (PreconditionFailed). Returns the version the write made."""
        view = memoryview(data).cast("B")
        self.check_range(offset, len(view))
        with self._io() as live, self.versions.conditional(precondition):
            if not view:
                if fua:
                    self._flush_queue()
                return self.versions.value
            with self.versions.writing() as made:
                self._write(live.logical_block_size, offset, view, fua=fua)
        return made[0]

    def flush(self) -> None:
        """Returns once every write completed before it is durable."""
        with self._io():
            self._flush_queue()

    def discard(self, offset: int, length: int) -> None:
        self.check_range(offset, length)
        with self._io() as live, self.versions.writing():
            self._discard(live, offset, length)

    def write_zeroes(self, offset: int, length: int) -> None:
        self.check_range(offset, length)
        with self._io() as live, self.versions.writing():
            self._write_zeroes(live.logical_block_size, offset, length)

    # ------------------------------------------------------ the partial-block rule
    #
    # The same for every caller, one I/O or a batch, HTTP or NBD: a read of partial
    # logical blocks reads the whole blocks around it and copies its bytes out; a write
    # with partial edge blocks read-modify-writes them under an exclusive range lock;
    # write-zeroes does the same with zero bytes; a discard is rounded inward (it is
    # advisory: the partial blocks at its edges keep their data).

    def _read_into(self, unit: int, offset: int, buffer: memoryview) -> None:
        length = len(buffer)
        start = align_down(offset, unit)
        end = align_up(offset + length, unit)
        with self._ranges.hold(start, end, exclusive=False):
            if start == offset and end == offset + length:
                self._submit(Op.READ, start, length, [buffer])
            else:
                with mempool.borrow(end - start) as scratch:
                    self._submit(Op.READ, start, end - start, [scratch])
                    buffer[:] = scratch[offset - start : offset - start + length]

    def _write(
        self, unit: int, offset: int, view: memoryview, *, fua: bool, may_overwrite: bool = False
    ) -> None:
        if offset % unit == 0 and len(view) % unit == 0:
            with self._ranges.hold(offset, offset + len(view), exclusive=False):
                self._submit(
                    Op.WRITE, offset, len(view), [view], fua=fua, may_overwrite=may_overwrite
                )
        else:
            self._read_modify_write(unit, offset, view, fua=fua)

    def _read_modify_write(self, unit: int, offset: int, view: memoryview, *, fua: bool) -> None:
        """A write with partial edge units, holding them exclusive from read to write."""
        length = len(view)
        start = align_down(offset, unit)
        end = align_up(offset + length, unit)
        with (
            self._ranges.hold(start, end, exclusive=True),
            mempool.borrow(end - start) as merged,
        ):
            head_partial = offset != start
            tail_partial = (offset + length) != end
            if head_partial:
                self._submit(Op.READ, start, unit, [merged[:unit]])
            if tail_partial and not (head_partial and end - start == unit):
                self._submit(Op.READ, end - unit, unit, [merged[len(merged) - unit :]])
            merged[offset - start : offset - start + length] = view
            # ``merged`` is this method's own: no one reads it after the write.
            self._submit(Op.WRITE, start, len(merged), [merged], fua=fua, may_overwrite=True)

    def _write_zeroes(self, unit: int, offset: int, length: int) -> None:
        """Encrypted zeros over the whole blocks, zero bytes read-modify-written into the
        partial ones at the edges."""
        end = offset + length
        start = min(align_up(offset, unit), end)
        stop = max(align_down(end, unit), start)
        if start > offset:
            self._read_modify_write(unit, offset, memoryview(bytes(start - offset)), fua=False)
        self._zero(Op.WRITE_ZEROES, start, stop - start)
        if end > stop:
            self._read_modify_write(unit, stop, memoryview(bytes(end - stop)), fua=False)

    def _discard(self, live: LiveMap, offset: int, length: int) -> None:
        for line in live.table.lines:
            overlaps = (
                line.start * SECTOR_SIZE < offset + length and offset < line.end * SECTOR_SIZE
            )
            if overlaps and isinstance(line.target, CryptParams) and not line.target.allow_discards:
                raise InvalidState("discard needs the allow_discards crypt option")
        unit = live.logical_block_size
        start = align_up(offset, unit)
        self._zero(Op.DISCARD, start, align_down(offset + length, unit) - start)

    def _zero(self, op: Op, offset: int, length: int) -> None:
        """Discard or write-zeroes over whole blocks (nothing when ``length`` <= 0)."""
        if length <= 0:
            return
        with self._ranges.hold(offset, offset + length, exclusive=False):
            step = self.limits.max_sectors * SECTOR_SIZE
            for position in range(offset, offset + length, step):
                self._submit(op, position, min(step, offset + length - position), [])

    def _flush_queue(self) -> None:
        bio = Bio(Op.FLUSH, 0, 0, [], preflush=True)
        self.queue.submit_bio(bio)
        bio.wait()

    # ------------------------------------------------------------------ batches

    prompt = False
    """As a device (stacked): its I/O waits on its own queue."""

    def overlaps_batches(self) -> bool:
        """Whether the live table maps onto a device that waits on the network or another
        thread, where batches overlap (``LiveMap.overlapped``)."""
        live = self.live
        return live is not None and live.overlapped

    def serves_promptly(self) -> bool:
        """Whether every target of the live table maps without waiting on another thread,
        a timer or the network: a batch may then be started on an event loop
        (``start_batch(wait=False)``)."""
        live = self.live
        return live is not None and all(target.prompt for target in live.targets)

    def submit_batch(
        self, ios: Sequence[BlockIo], *, precondition: Precondition | None = None
    ) -> int:
        """The batch API every front end uses (through ``app.io``): I/Os of any op and
        alignment from one submitter, admitted once, done in order where that matters.

        Runs of reads and whole-block writes enter the queue together, under one plug
        (``submit_bios``: the batch was the plug's window), so adjacent ones merge; any
        other I/O (a partial write, flush, discard, write-zeroes) waits for the run before
        it and runs alone, so overlapping I/Os apply in batch order. Each I/O's failure
        lands in its ``error``; only ``precondition`` (checked atomically with the batch)
        raises, PreconditionFailed, before anything is done. Returns the version the
        batch's writes made (the current one when it wrote nothing).
        """
        try:
            live = self._admit()
        except Exception as error:  # not admitted: suspended too long, removed, past the lease
            for io in ios:
                io.error = error
            return self.versions.value
        try:
            with self.versions.conditional(precondition):
                if not any(io.op in _WRITES for io in ios):
                    self._run_batch(live, ios)
                    return self.versions.value
                with self.versions.writing() as made:
                    self._run_batch(live, ios)
            return made[0]
        finally:
            self._release()

    def _run_batch(self, live: LiveMap, ios: Sequence[BlockIo]) -> None:
        unit = live.logical_block_size
        if len(ios) == 1:  # nothing to plug with: the one-I/O path (a single-range request)
            (io,) = ios
            try:
                self.check_range(io.offset, io.length)
                if io.op is Op.READ and io.buffer:
                    self._read_into(unit, io.offset, io.buffer)
                else:
                    self._run_alone(live, io)
            except Exception as error:
                io.error = error
            return
        run: list[BlockIo] = []
        for io in self._in_range(ios):
            if _plugs(io, unit):
                run.append(io)
                continue
            self._run_plugged(unit, run)
            run = []
            try:
                self._run_alone(live, io)
            except Exception as error:
                io.error = error
        self._run_plugged(unit, run)

    def _run_plugged(self, unit: int, run: list[BlockIo]) -> None:
        """Reads and whole-block writes together; a partial read through a whole-block
        buffer, copied out once done."""
        if not run:
            return
        ranges: list[tuple[int, int]] = []
        bios: list[tuple[BlockIo, Bio]] = []
        copies: list[tuple[BlockIo, memoryview]] = []
        for io in run:
            buffer = io.buffer
            assert buffer is not None
            start = align_down(io.offset, unit)
            end = align_up(io.offset + io.length, unit)
            if start != io.offset or end != io.offset + io.length:
                whole = memoryview(bytearray(end - start))
                copies.append((io, whole[io.offset - start : io.offset - start + io.length]))
                buffer = whole
            ranges.append((start, end))
            bios.append((io, _bio(io, start, buffer)))
        with self._ranges.hold_shared(ranges):
            StartedBatch(self._queue(bios, [bio for _, bio in bios]), ExitStack()).finish()
        for io, source in copies:
            if io.error is None:
                assert io.buffer is not None
                io.buffer[:] = source

    def _run_alone(self, live: LiveMap, io: BlockIo) -> None:
        unit = live.logical_block_size
        op = io.op
        if op is Op.WRITE:
            assert io.buffer is not None
            if io.length:
                self._write(unit, io.offset, io.buffer, fua=io.fua, may_overwrite=io.may_overwrite)
                return
        elif op is Op.WRITE_ZEROES:
            self._write_zeroes(unit, io.offset, io.length)
        elif op is Op.DISCARD:
            self._discard(live, io.offset, io.length)
        elif op is Op.FLUSH:
            self._flush_queue()
            return
        if io.fua:
            self._flush_queue()

    def start_batch(self, ios: Sequence[BlockIo], *, wait: bool = True) -> StartedBatch | None:
        """A batch of whole-block reads and writes admitted and queued (requests ready at
        once are dispatched on this thread), to be ``finish``ed: the first half of
        ``submit_batch``, for an event loop. None, with nothing done, when an I/O is not a
        whole-block read or write, or (``wait=False``) where admission would wait
        (suspended, a range held exclusive)."""
        live = self.live
        if live is None:
            return None
        unit = live.logical_block_size
        for io in ios:
            op, offset, length = io.op, io.offset, io.length
            # _whole_blocks, inline: once per I/O
            if not (
                (op is REQ_OP_READ or op is REQ_OP_WRITE)
                and length > 0
                and offset % unit == 0
                and length % unit == 0
            ):
                return None
        hold = ExitStack()
        try:
            hold.enter_context(self._io(wait=wait))
            admitted = self._in_range(ios)
            ranges = []
            writes = False
            for io in admitted:
                ranges.append((io.offset, io.offset + io.length))
                writes |= io.op is REQ_OP_WRITE
            hold.enter_context(self._ranges.hold_shared(ranges, wait=wait))
            if writes:
                # Counted once the ranges are held: a refused batch never moves the version.
                hold.enter_context(self.versions.writing())
        except WouldBlock:
            hold.close()
            for io in ios:
                io.error = None
            return None
        except Exception as error:  # not admitted: suspended too long, or removed
            hold.close()
            for io in ios:
                if io.error is None:
                    io.error = error
            return StartedBatch([], ExitStack())
        submitted: list[tuple[BlockIo, Bio]] = []
        bios = []
        for io in admitted:
            buffer = io.buffer
            assert buffer is not None
            # Flags stored, not passed: keywords make the class call build a dict.
            bio = Bio(io.op, io.offset // SECTOR_SIZE, len(buffer) // SECTOR_SIZE, [buffer])
            bio.fua = io.fua
            bio.may_overwrite = io.may_overwrite
            submitted.append((io, bio))
            bios.append(bio)
        return StartedBatch(self._queue(submitted, bios), hold)

    def _in_range(self, ios: Sequence[BlockIo]) -> list[BlockIo]:
        """The I/Os within the volume; each of the others fails alone, RangeNotSatisfiable."""
        size = self.size
        within: list[BlockIo] = []
        for io in ios:
            offset, length = io.offset, io.length
            if offset < 0 or length < 0 or offset + length > size:
                try:
                    self.check_range(offset, length)
                except RangeNotSatisfiable as error:
                    io.error = error
                    continue
            within.append(io)
        return within

    def _queue(
        self, submitted: list[tuple[BlockIo, Bio]], bios: list[Bio]
    ) -> list[tuple[BlockIo, Bio]]:
        """``bios`` (``submitted``'s, in order) into the queue; when the queue refuses one,
        nothing is queued and every I/O gets its error."""
        try:
            self.queue.submit_bios(bios)
        except Exception as error:
            for io, _ in submitted:
                io.error = error
            return []
        return submitted


def _bio(io: BlockIo, offset: int, buffer: memoryview) -> Bio:
    """``io``'s bio over ``buffer`` (its own, or the whole blocks around a partial read)."""
    return Bio(
        io.op,
        offset // SECTOR_SIZE,
        len(buffer) // SECTOR_SIZE,
        [buffer],
        fua=io.fua,
        may_overwrite=io.may_overwrite,
    )


def _whole_blocks(io: BlockIo, unit: int) -> bool:
    """A read or write of whole logical blocks: it goes to the queue as it is."""
    return (
        (io.op is REQ_OP_READ or io.op is REQ_OP_WRITE)
        and io.length > 0
        and io.offset % unit == 0
        and io.length % unit == 0
    )


def _plugs(io: BlockIo, unit: int) -> bool:
    """Joins a batch's run: any read (a partial one through a whole-block buffer), or a
    whole-block write."""
    return (io.op is Op.READ and io.length > 0) or _whole_blocks(io, unit)
