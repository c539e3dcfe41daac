"""A mapped device at run time: tables, targets, its block queue and the data path.

Pure core: no SQL, no HTTP. The control plane (``app.control``) persists every
transition before applying it here, under the volume's lifecycle lock.

I/O enters through ``read``/``write``/``flush``/``discard``/``write_zeroes`` with
byte offsets of any alignment; they become bios of whole logical blocks, go
through the block queue (plug, merge, elevator) and reach ``_dispatch``, which
hands each request to the one target it lies in (the queue never lets a request
cross a target boundary).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Literal

from typing_extensions import Buffer

from app.blk import mempool
from app.blk.bio import Bio
from app.blk.limits import QueueLimits
from app.blk.queue import BlockQueue
from app.blk.request import Request
from app.blk.stats import QueueStats
from app.blk.wait import WaitQueue
from app.crypto.keys import KeyMaterial
from app.crypto.transform import make_transform
from app.dm.rangelock import RangeLock
from app.dm.table import (
    CryptParams,
    DeviceRef,
    ErrorParams,
    LinearParams,
    Table,
    TableLine,
    ZeroParams,
)
from app.dm.targets import (
    BlockDevice,
    CryptTarget,
    ErrorTarget,
    LinearTarget,
    MapContext,
    Target,
    ZeroTarget,
)
from app.dm.timed import TimedDevice
from app.engine.base import Engine
from app.errors import (
    InvalidInput,
    InvalidState,
    KeyNotSet,
    RangeNotSatisfiable,
    Unavailable,
)
from app.vocab import DEFAULT_QUEUE_DEPTH, SECTOR_SIZE, DispatchMode, ElevatorName, Op

DeviceResolver = Callable[[DeviceRef], BlockDevice]


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


def missing_key(table: Table) -> int | None:
    """1-based index of the first crypt line whose key was wiped, if any."""
    for index, line in enumerate(table.lines, start=1):
        params = line.target
        if (
            isinstance(params, CryptParams)
            and params.key is None
            and params.cipher.valid_key_sizes != (0,)
        ):
            return index
    return None


@dataclass(slots=True, eq=False)
class BatchIo:
    """One whole-block read or write of ``Volume.submit_batch``: READ fills ``buffer``."""

    op: Literal[Op.READ, Op.WRITE]
    offset: int
    buffer: memoryview
    fua: bool = False
    error: Exception | None = None


@dataclass(slots=True)
class VolumeInfo:
    name: str
    uuid: str
    state: Literal["active", "suspended"]
    event_nr: int
    open_count: int
    dispatch_mode: DispatchMode
    engine: str
    elevator: str
    limits: QueueLimits
    plug_window_us: int
    queue_depth: int
    has_live: bool
    has_inactive: bool
    size_sectors: int
    extra: dict[str, object] = field(default_factory=dict)


class Volume:
    """One mapped device. Lifecycle calls are serialized by the caller (``lock``)."""

    def __init__(
        self,
        name: str,
        uuid: str,
        *,
        engine: Engine,
        limits: QueueLimits,
        dispatch_mode: DispatchMode = "request",
        elevator: ElevatorName = "none",
        plug_window_us: int = 50,
        suspend_wait_seconds: float = 30.0,
    ) -> None:
        self.name = name
        self.uuid = uuid
        self.lock = threading.RLock()
        self.engine = engine
        self.dispatch_mode: DispatchMode = dispatch_mode
        self.elevator: ElevatorName = elevator
        self.suspend_wait_seconds = suspend_wait_seconds
        self.state: Literal["active", "suspended"] = "suspended"
        self.live: LiveMap | None = None
        self.inactive: Table | None = None
        self.event_nr = 0
        self.generation = 0
        self.open_count = 0
        #: Served by the NBD front end under this volume's name (set by the control plane).
        self.nbd_export = False
        self.stats = QueueStats()
        self._requested_limits = limits
        self.queue = BlockQueue(
            self._dispatch,
            limits=limits,
            dispatch_mode=dispatch_mode,
            elevator=elevator,
            plug_window_us=plug_window_us,
            stats=self.stats,
        )
        self._ranges = RangeLock()
        self._gate = WaitQueue()
        self._in_flight = 0

    # ------------------------------------------------------------------ lifecycle

    @property
    def limits(self) -> QueueLimits:
        return self.queue.limits

    @property
    def size(self) -> int:
        return self.live.size_bytes if self.live else 0

    def load(self, table: Table) -> None:
        """dmsetup load: the table goes to the inactive slot."""
        self.inactive = table

    def clear_inactive(self) -> None:
        self.inactive = None

    def check_resumable(self) -> None:
        table = self.inactive or (self.live.table if self.live else None)
        if table is None:
            raise InvalidState(f"volume {self.name} has no table to resume")
        line = missing_key(table)
        if line is not None:
            raise KeyNotSet(f"line {line}: crypt key is not set")

    def resume(self, resolve: DeviceResolver) -> Table | None:
        """Swap the inactive table in (if any) and let I/O flow. Returns the replaced table."""
        self.check_resumable()
        replaced: Table | None = None
        if self.inactive is not None:
            new_live = self._build(self.inactive, resolve)
            old = self.live
            self.live = new_live
            self.inactive = None
            self.queue.set_boundaries([target.start for target in new_live.targets[1:]])
            self.queue.set_queue_depth(new_live.queue_depth)
            self._apply_block_size(new_live.logical_block_size)
            if old is not None:
                replaced = old.table
                for target in old.targets:
                    target.wipe()
            self.generation += 1
        with self._gate:
            self.state = "active"
            self._gate.notify_all()
        self.queue.release()
        self.event_nr += 1
        return replaced

    def suspend(self, *, noflush: bool = False, timeout: float | None = None) -> None:
        """Hold new I/O; unless ``noflush``, first wait for in-flight I/O to finish."""
        with self._gate:
            self.state = "suspended"
        if not noflush:
            self.drain(timeout)
        self.queue.hold()
        self.event_nr += 1

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

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def plan_message(self, words: Sequence[str], sector: int = 0) -> tuple[int, Table]:
        """dmsetup message ``key set <hex>`` / ``key wipe`` on the crypt target at ``sector``.

        Validates and returns (line index, new live table) without applying it, so
        the caller can persist first. Only while suspended, as dm-crypt requires.
        """
        if self.state != "suspended":
            raise InvalidState("crypt key messages need the volume suspended")
        if self.live is None:
            raise InvalidState(f"volume {self.name} has no live table")
        if len(words) < 2 or words[0].lower() != "key" or words[1].lower() not in ("set", "wipe"):
            raise InvalidInput("unsupported message; crypt accepts 'key set <hex>' and 'key wipe'")
        index = next(
            (i for i, t in enumerate(self.live.targets) if t.start <= sector < t.end), None
        )
        if index is None:
            raise InvalidInput(f"sector {sector} is beyond the table")
        line = self.live.table.lines[index]
        if not isinstance(line.target, CryptParams):
            raise InvalidInput(f"the target at sector {sector} is {line.target_type}, not crypt")
        params = line.target
        if words[1].lower() == "wipe":
            if len(words) != 2:
                raise InvalidInput("'key wipe' takes no argument")
            size = len(params.key) if params.key is not None else params.wiped_key_size
            new_params = replace(params, key=None, wiped_key_size=size)
        else:
            if len(words) != 3:
                raise InvalidInput("'key set' takes exactly one key")
            key = KeyMaterial.from_hex(words[2])
            params.cipher.check_key(key)
            new_params = replace(params, key=key, wiped_key_size=0)
        lines = list(self.live.table.lines)
        lines[index] = replace(line, target=new_params)
        return index, Table(tuple(lines))

    def apply_line(self, index: int, table: Table, resolve: DeviceResolver) -> None:
        """Install line ``index`` of ``table`` (a planned message) into the live map."""
        assert self.live is not None
        targets = list(self.live.targets)
        targets[index].wipe()
        targets[index] = self._target(table.lines[index], resolve)
        self.live = replace(self.live, table=table, targets=targets)
        self.event_nr += 1

    def install_suspended(self, table: Table, resolve: DeviceResolver) -> None:
        """Restore a live table at startup without letting I/O flow (its key may be wiped)."""
        self.live = self._build(table, resolve)
        self.queue.set_boundaries([target.start for target in self.live.targets[1:]])
        self.queue.set_queue_depth(self.live.queue_depth)
        self._apply_block_size(self.live.logical_block_size)
        self.queue.hold()

    def retune(
        self,
        *,
        dispatch_mode: DispatchMode | None = None,
        engine: Engine | None = None,
        limits: QueueLimits | None = None,
        elevator: ElevatorName | None = None,
        plug_window_us: int | None = None,
    ) -> None:
        if plug_window_us is not None:
            self.queue.set_plug_window(plug_window_us)
        if dispatch_mode is not None:
            self.dispatch_mode = dispatch_mode
            self.queue.set_dispatch_mode(dispatch_mode)
        if elevator is not None:
            self.elevator = elevator
            self.queue.set_elevator(elevator)
        if limits is not None:
            self._requested_limits = limits
            self._apply_block_size(self.live.logical_block_size if self.live else SECTOR_SIZE)
        if engine is not None and self.live is not None:
            self.engine = engine
            for target in self.live.targets:
                if isinstance(target, CryptTarget):
                    target.engine = engine
        elif engine is not None:
            self.engine = engine

    def remove(self) -> None:
        self.queue.hold()
        if self.live is not None:
            for target in self.live.targets:
                target.wipe()
        self.live = None
        self.inactive = None

    def _apply_block_size(self, block_size: int) -> None:
        limits = self._requested_limits
        if limits.logical_block_size < block_size:
            limits = replace(limits, logical_block_size=block_size)
        self.queue.set_limits(limits)

    def _build(self, table: Table, resolve: DeviceResolver) -> LiveMap:
        targets: list[Target] = []
        depths: list[int] = []

        def resolve_noting_depth(ref: DeviceRef) -> BlockDevice:
            device = resolve(ref)
            if isinstance(device, TimedDevice):
                depths.append(device.queue_depth)
            return device

        try:
            for line in table.lines:
                targets.append(self._target(line, resolve_noting_depth))
        except BaseException:
            for target in targets:
                target.wipe()
            raise
        depth = min(depths, default=DEFAULT_QUEUE_DEPTH)
        return LiveMap(table, targets, table.logical_block_size, depth)

    def _target(self, line: TableLine, resolve: DeviceResolver) -> Target:
        params = line.target
        if isinstance(params, CryptParams):
            if params.key is None and params.cipher.valid_key_sizes != (0,):
                # Wiped key: no I/O can reach it, resume refuses until ``key set``.
                return ErrorTarget(line.start, line.length)
            return self._crypt_target(line, resolve(params.device))
        if isinstance(params, LinearParams):
            return LinearTarget(line.start, line.length, resolve(params.device), params.offset)
        if isinstance(params, ZeroParams):
            return ZeroTarget(line.start, line.length)
        assert isinstance(params, ErrorParams)
        return ErrorTarget(line.start, line.length)

    def _crypt_target(self, line: TableLine, device: BlockDevice) -> CryptTarget:
        params = line.target
        assert isinstance(params, CryptParams)
        key = params.key if params.key is not None else KeyMaterial(b"")
        transform = make_transform(
            params.cipher,
            key,
            sector_size=params.sector_size,
            iv_offset=params.iv_offset,
            iv_large_sectors=params.iv_large_sectors,
        )
        return CryptTarget(line.start, line.length, params, transform, device, self.engine)

    # ------------------------------------------------------------------ data path

    def _dispatch(self, request: Request) -> None:
        live = self.live
        if live is None:
            raise InvalidState(f"volume {self.name} has no live table")
        context = MapContext(dispatch_mode=self.dispatch_mode)
        if request.op == Op.FLUSH:
            for target in live.targets:
                target.flush()
            return
        result = live.target_at(request.sector).map(request, context)
        if result.engine_calls:
            self.stats.add_engine_calls(result.engine_calls)

    @contextmanager
    def _io(self) -> Iterator[LiveMap]:
        """Admit one I/O: wait while suspended (bounded), count it in flight."""
        deadline = time.monotonic() + self.suspend_wait_seconds
        with self._gate:
            while self.state != "active":
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise Unavailable(
                        f"volume {self.name} is suspended; retry after resume",
                        retry_after=max(1, int(self.suspend_wait_seconds)),
                    )
                self._gate.wait(remaining)
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
        with self._io(), self._ranges.hold(offset, offset + length, exclusive=False):
            self._submit(Op.WRITE, offset, length, views)
        self.generation += 1

    def _aligned(self, offset: int, lengths: list[int]) -> bool:
        """Whole logical blocks in every segment: the crypt targets below split no unit."""
        live = self.live
        unit = live.logical_block_size if live else SECTOR_SIZE
        return offset % unit == 0 and all(length % unit == 0 for length in lengths)

    def read(self, offset: int, length: int) -> bytearray:
        buffer = bytearray(length)
        self.read_into(offset, memoryview(buffer))
        return buffer

    def write(self, offset: int, data: Buffer, *, fua: bool = False) -> None:
        """Write at ``offset``; partial edge units are read-modify-written under an exclusive lock."""
        view = memoryview(data).cast("B")
        length = len(view)
        self.check_range(offset, length)
        if length == 0:
            if fua:
                self.flush()
            return
        with self._io() as live:
            unit = live.logical_block_size
            start = offset - offset % unit
            end = -(-(offset + length) // unit) * unit
            if start == offset and end == offset + length:
                with self._ranges.hold(start, end, exclusive=False):
                    self._submit(Op.WRITE, start, length, [view], fua=fua)
            else:
                self._read_modify_write(unit, offset, view, fua=fua)
            self.generation += 1

    def submit_batch(self, ios: Sequence[BatchIo]) -> None:
        """Whole-block reads and writes from one submitter (an NBD client's pipelined
        requests), queued under one plug and merged as one task's plugged bios are,
        dispatched at once (``submit_bios``: the batch was the plug's window), then
        waited for together. Never raises: each I/O's failure lands in its ``error``."""
        if not ios:
            return
        try:
            with self._io():
                admitted: list[BatchIo] = []
                for io in ios:
                    try:
                        self.check_range(io.offset, len(io.buffer))
                    except Exception as error:
                        io.error = error
                        continue
                    admitted.append(io)
                ranges = [(io.offset, io.offset + len(io.buffer)) for io in admitted]
                with self._ranges.hold_shared(ranges):
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
                        return
                    wrote = False
                    for io, bio in submitted:
                        try:
                            bio.wait()
                        except Exception as error:
                            io.error = error
                        wrote |= io.op is Op.WRITE
                    if wrote:
                        self.generation += 1
        except Exception as error:  # not admitted: suspended too long, or removed
            for io in ios:
                if io.error is None:
                    io.error = error

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

    def _submit_together(
        self, op: Op, ios: Sequence[tuple[int, memoryview]]
    ) -> list[BaseException | None]:
        """Aligned I/Os as bios under one plug (io_submit): adjacent ones merge into one
        request, overlapping writes reach the device in order. Returns each one's error."""
        if not ios:
            return []
        start = min(offset for offset, _ in ios)
        end = max(offset + len(buffer) for offset, buffer in ios)
        # One shared hold over the batch's span: it only excludes read-modify-writes.
        with self._ranges.hold(start, end, exclusive=False):
            bios = [
                Bio(op, offset // SECTOR_SIZE, len(buffer) // SECTOR_SIZE, [buffer])
                for offset, buffer in ios
            ]
            self.queue.submit_bios(bios)
            errors: list[BaseException | None] = []
            for bio in bios:
                try:
                    bio.wait()
                    errors.append(None)
                except Exception as error:
                    errors.append(error)
            return errors

    def _write_run(
        self,
        ios: Sequence[tuple[int, memoryview]],
        run: list[int],
        errors: list[BaseException | None],
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
        self, ios: Sequence[tuple[int, memoryview]], *, fua: bool = False
    ) -> list[BaseException | None]:
        """Independent writes issued together, applied in order where they overlap.

        Runs of aligned writes go to the queue together; a write with partial
        edge units is read-modify-written after the run before it completes.
        Returns each write's error (None: written); ``fua`` makes every
        successful write durable before returning.
        """
        for offset, buffer in ios:
            self.check_range(offset, len(buffer))
        errors: list[BaseException | None] = [None] * len(ios)
        with self._io() as live:
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
            self.generation += 1
            if fua and any(error is None for error in errors):
                bio = Bio(Op.FLUSH, 0, 0, [], preflush=True)
                self.queue.submit_bio(bio)
                bio.wait()
        return errors

    def flush(self) -> None:
        """Returns once every write completed before it is durable."""
        with self._io():
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
            with self._ranges.hold(offset, offset + length, exclusive=False):
                step = self.limits.max_sectors * SECTOR_SIZE
                for position in range(offset, offset + length, step):
                    chunk = min(step, offset + length - position)
                    self._submit(op, position, chunk, [])
            self.generation += 1

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

    def info(self) -> VolumeInfo:
        return VolumeInfo(
            name=self.name,
            uuid=self.uuid,
            state=self.state,
            event_nr=self.event_nr,
            open_count=self.open_count,
            dispatch_mode=self.dispatch_mode,
            engine=self.engine.name,
            elevator=self.elevator,
            limits=self.limits,
            plug_window_us=self.queue.plug_window_us,
            queue_depth=self.queue.queue_depth,
            has_live=self.live is not None,
            has_inactive=self.inactive is not None,
            size_sectors=self.live.table.size_sectors if self.live else 0,
        )
