"""A volume's data path: byte-range I/O in, bios through the block queue, requests to targets.

``read``/``write``/``flush``/``discard``/``write_zeroes`` take byte offsets of
any alignment; they become bios of whole logical blocks, go through the block
queue (plug, merge, elevator) and reach ``_dispatch``, which hands each request
to the one target it lies in (the queue never lets a request cross a target
boundary). A write with partial edge blocks is a read-modify-write under an
exclusive range lock, so concurrent partial writes to one block never lose each
other; whole-block I/O shares the range.

Every I/O is admitted through one gate: while suspended it waits (bounded by
``suspend_wait_seconds``), and it is counted in flight so suspend can drain.
Past ``lease_deadline`` (a cluster node whose lease on the volume was not
renewed in time) the gate refuses every I/O: that node is fenced.
The lifecycle (``app.dm.volume``) swaps tables and opens or closes the gate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Literal

from typing_extensions import Buffer

from app.blk import mempool
from app.blk.bio import Bio
from app.blk.limits import QueueLimits
from app.blk.queue import BlockQueue, Wait, completed
from app.blk.request import Request
from app.blk.stats import QueueStats
from app.blk.tuning import Tuning
from app.blk.wait import WaitQueue, WouldBlock
from app.dm.generation import Generation, Precondition
from app.dm.rangelock import RangeLock
from app.dm.table import CryptParams, Table
from app.dm.targets import MapContext, Target
from app.errors import (
    InvalidInput,
    InvalidState,
    LeaseExpired,
    RangeNotSatisfiable,
    Unavailable,
)
from app.vocab import DEFAULT_QUEUE_DEPTH, DISPATCH_MODES, SECTOR_SIZE, Op

_CONTEXTS = {mode: MapContext(dispatch_mode=mode) for mode in DISPATCH_MODES}


@dataclass(slots=True, eq=False)
class BatchIo:
    """One whole-block read or write of ``DataPath.submit_batch``: READ fills ``buffer``."""

    op: Literal[Op.READ, Op.WRITE]
    offset: int
    buffer: memoryview
    fua: bool = False
    error: Exception | None = None


class StartedBatch:
    """A batch admitted and queued (``DataPath.start_batch``): ``finish`` waits for its bios,
    records each I/O's error, and lets go of the volume (in-flight count, range holds)."""

    __slots__ = ("_hold", "_submitted")

    def __init__(self, submitted: list[tuple[BatchIo, Bio]], hold: ExitStack) -> None:
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

    @property
    def size_bytes(self) -> int:
        return self.table.size_sectors * SECTOR_SIZE

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
    ) -> None:
        self.name = name
        self.suspend_wait_seconds = suspend_wait_seconds
        self.state: Literal["active", "suspended"] = "suspended"
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
        self._ranges = RangeLock()
        self._gate = WaitQueue()
        self._in_flight = 0
        #: ``time.monotonic()`` past which this node may no longer own the volume (a cluster
        #: node's lease, renewed in the background); every I/O checks it when admitted.
        self.lease_deadline = math.inf

    @property
    def generation(self) -> int:
        return self.versions.value

    def read_versioned(self, read: Callable[[], None], attempts: int = 3) -> int | None:
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

    def _set_state(self, state: Literal["active", "suspended"]) -> None:
        """Open or close the gate; waiting I/O re-checks it."""
        with self._gate:
            self.state = state
            self._gate.notify_all()

    def fence(self, deadline: float) -> None:
        """Move the lease deadline; I/O waiting at the gate re-checks it (``-inf``: at once)."""
        with self._gate:
            self.lease_deadline = deadline
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
        context = _CONTEXTS[self.queue.dispatch_mode]
        if request.op == Op.FLUSH:
            for target in live.targets:
                target.flush()
            return None
        finish = live.target_at(request.sector).submit(request, context)

        def wait() -> None:
            result = finish()
            if result.engine_calls:
                self.stats.add_engine_calls(result.engine_calls)

        return wait

    @contextmanager
    def _io(self, *, wait: bool = True) -> Iterator[LiveMap]:
        """Admit one I/O: wait while suspended (bounded), count it in flight.
        ``wait=False``: WouldBlock where it would wait."""
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
        try:
            yield live
        finally:
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
        self, op: Op, offset: int, length: int, segments: list[memoryview], *, fua: bool = False
    ) -> None:
        bio = Bio(op, offset // SECTOR_SIZE, length // SECTOR_SIZE, segments, fua=fua)
        self.queue.submit_bio(bio)
        bio.wait()

    def read_into(self, offset: int, buffer: memoryview) -> None:
        """Read ``len(buffer)`` bytes at ``offset``; any alignment."""
        length = len(buffer)
        self.check_range(offset, length)
        if length == 0:
            return
        with self._io() as live:
            unit = live.logical_block_size
            start = offset - offset % unit
            end = -(-(offset + length) // unit) * unit
            with self._ranges.hold(start, end, exclusive=False):
                if start == offset and end == offset + length:
                    self._submit(Op.READ, start, length, [buffer])
                else:
                    with mempool.borrow(end - start) as scratch:
                        self._submit(Op.READ, start, end - start, [scratch])
                        buffer[:] = scratch[offset - start : offset - start + length]

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
        """Write at ``offset``; partial edge units are read-modify-written under an exclusive
        lock. ``precondition`` is checked atomically with the write (PreconditionFailed).
        Returns the version the write made."""
        view = memoryview(data).cast("B")
        length = len(view)
        self.check_range(offset, length)
        with self._io() as live, self.versions.conditional(precondition):
            if length == 0:
                if fua:
                    self._flush_queue()
                return self.versions.value
            unit = live.logical_block_size
            start = offset - offset % unit
            end = -(-(offset + length) // unit) * unit
            with self.versions.writing() as made:
                if start == offset and end == offset + length:
                    with self._ranges.hold(start, end, exclusive=False):
                        self._submit(Op.WRITE, start, length, [view], fua=fua)
                else:
                    self._read_modify_write(unit, offset, view, fua=fua)
        return made[0]

    def _read_modify_write(self, unit: int, offset: int, view: memoryview, *, fua: bool) -> None:
        """A write with partial edge units, holding them exclusive from read to write."""
        length = len(view)
        start = offset - offset % unit
        end = -(-(offset + length) // unit) * unit
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
            self._submit(Op.WRITE, start, len(merged), [merged], fua=fua)

    # ------------------------------------------------------------- batched I/O

    prompt = False
    """As a device (stacked): its I/O waits on its own queue."""

    def serves_promptly(self) -> bool:
        """Whether every target of the live table maps without waiting on another thread,
        a timer or the network: a batch may then be started on an event loop
        (``start_batch(wait=False)``)."""
        live = self.live
        return live is not None and all(target.prompt for target in live.targets)

    def submit_batch(self, ios: Sequence[BatchIo]) -> None:
        """Whole-block reads and writes from one submitter (an NBD client's pipelined
        requests), queued under one plug and merged as one task's plugged bios are,
        dispatched at once (``submit_bios``: the batch was the plug's window), then
        waited for together. Never raises: each I/O's failure lands in its ``error``."""
        started = self.start_batch(ios)
        assert started is not None
        started.finish()

    def start_batch(self, ios: Sequence[BatchIo], *, wait: bool = True) -> StartedBatch | None:
        """``submit_batch`` up to the wait: admitted and queued (requests ready at once are
        dispatched on this thread), to be ``finish``ed. ``wait=False``: None, with nothing
        done, where admission would wait (suspended, a range held exclusive)."""
        hold = ExitStack()
        try:
            hold.enter_context(self._io(wait=wait))
            admitted: list[BatchIo] = []
            for io in ios:
                try:
                    self.check_range(io.offset, len(io.buffer))
                except Exception as error:
                    io.error = error
                    continue
                admitted.append(io)
            ranges = [(io.offset, io.offset + len(io.buffer)) for io in admitted]
            hold.enter_context(self._ranges.hold_shared(ranges, wait=wait))
            if any(io.op is Op.WRITE for io in admitted):
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
        return StartedBatch(self._queue_batch(admitted), hold)

    def _submit_batch(self, admitted: list[BatchIo]) -> None:
        StartedBatch(self._queue_batch(admitted), ExitStack()).finish()

    def _queue_batch(self, admitted: list[BatchIo]) -> list[tuple[BatchIo, Bio]]:
        """Bios for ``admitted`` into the queue; those the queue refuses get its error."""
        submitted = [
            (
                io,
                Bio(
                    io.op,
                    io.offset // SECTOR_SIZE,
                    len(io.buffer) // SECTOR_SIZE,
                    [io.buffer],
                    fua=io.fua,
                ),
            )
            for io in admitted
        ]
        try:
            self.queue.submit_bios([bio for _, bio in submitted])
        except Exception as error:  # a bio the queue refused: nothing was queued
            for io in admitted:
                io.error = error
            return []
        return submitted

    def _submit_together(
        self, op: Literal[Op.READ, Op.WRITE], ios: Sequence[tuple[int, memoryview]]
    ) -> list[Exception | None]:
        """Aligned I/Os of one op as one batch (io_submit): adjacent ones merge into one
        request, overlapping writes reach the device in order. Returns each one's error."""
        batch = [BatchIo(op, offset, buffer) for offset, buffer in ios]
        with self._ranges.hold_shared([(io.offset, io.offset + len(io.buffer)) for io in batch]):
            self._submit_batch(batch)
        return [io.error for io in batch]

    def _write_run(
        self,
        ios: Sequence[tuple[int, memoryview]],
        run: list[int],
        errors: list[Exception | None],
    ) -> None:
        if run:
            for index, error in zip(
                run, self._submit_together(Op.WRITE, [ios[i] for i in run]), strict=True
            ):
                errors[index] = error

    def read_batch(self, ios: Sequence[tuple[int, memoryview]]) -> None:
        """Fill each ``(offset, buffer)``, any alignment, all bios submitted together."""
        for offset, buffer in ios:
            self.check_range(offset, len(buffer))
        with self._io() as live:
            unit = live.logical_block_size
            aligned: list[tuple[int, memoryview]] = []
            copies: list[tuple[memoryview, memoryview]] = []
            for offset, buffer in ios:
                if not buffer:
                    continue
                start = offset - offset % unit
                end = -(-(offset + len(buffer)) // unit) * unit
                if start == offset and end == offset + len(buffer):
                    aligned.append((offset, buffer))
                    continue
                whole = memoryview(bytearray(end - start))
                aligned.append((start, whole))
                copies.append((buffer, whole[offset - start : offset - start + len(buffer)]))
            for error in self._submit_together(Op.READ, aligned):
                if error is not None:
                    raise error
            for buffer, source in copies:
                buffer[:] = source

    def write_batch(
        self,
        ios: Sequence[tuple[int, memoryview]],
        *,
        fua: bool = False,
        precondition: Precondition | None = None,
    ) -> tuple[list[Exception | None], int]:
        """Independent writes issued together, applied in order where they overlap.

        Runs of aligned writes go to the queue together; a write with partial
        edge units is read-modify-written after the run before it completes.
        Returns each write's error (None: written) and the version the batch made;
        ``fua`` makes every successful write durable before returning;
        ``precondition`` holds for the batch as a whole.
        """
        for offset, buffer in ios:
            self.check_range(offset, len(buffer))
        errors: list[Exception | None] = [None] * len(ios)
        with (
            self._io() as live,
            self.versions.conditional(precondition),
            self.versions.writing() as made,
        ):
            unit = live.logical_block_size
            run: list[int] = []
            for index, (offset, buffer) in enumerate(ios):
                if offset % unit == 0 and len(buffer) % unit == 0:
                    if buffer:
                        run.append(index)
                    continue
                self._write_run(ios, run, errors)
                run = []
                try:
                    self._read_modify_write(unit, offset, buffer, fua=False)
                except Exception as error:
                    errors[index] = error
            self._write_run(ios, run, errors)
            if fua and any(error is None for error in errors):
                self._flush_queue()
        return errors, made[0]

    def flush(self) -> None:
        """Returns once every write completed before it is durable."""
        with self._io():
            self._flush_queue()

    def _flush_queue(self) -> None:
        bio = Bio(Op.FLUSH, 0, 0, [], preflush=True)
        self.queue.submit_bio(bio)
        bio.wait()

    def _zero_range(self, op: Op, offset: int, length: int) -> None:
        self.check_range(offset, length)
        with self._io() as live:
            unit = live.logical_block_size
            if offset % unit or length % unit:
                raise InvalidInput(
                    f"{op.value} needs offset and length in whole {unit}-byte logical blocks"
                )
            if length == 0:
                return
            with (
                self.versions.writing(),
                self._ranges.hold(offset, offset + length, exclusive=False),
            ):
                step = self.limits.max_sectors * SECTOR_SIZE
                for position in range(offset, offset + length, step):
                    chunk = min(step, offset + length - position)
                    self._submit(op, position, chunk, [])

    def discard(self, offset: int, length: int) -> None:
        live = self.live
        if live is not None:
            for line in live.table.lines:
                overlaps = (
                    line.start * SECTOR_SIZE < offset + length and offset < line.end * SECTOR_SIZE
                )
                if (
                    overlaps
                    and isinstance(line.target, CryptParams)
                    and not line.target.allow_discards
                ):
                    raise InvalidState("discard needs the allow_discards crypt option")
        self._zero_range(Op.DISCARD, offset, length)

    def write_zeroes(self, offset: int, length: int) -> None:
        self._zero_range(Op.WRITE_ZEROES, offset, length)
