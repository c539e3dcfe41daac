"""A mapped device's lifecycle: tables, targets, suspend/resume, messages, retune.

Pure core: no SQL, no HTTP. The control plane (``app.control``) persists every
transition before applying it here, under the volume's lifecycle lock. The I/O
half (byte ranges to bios to targets) is ``app.dm.datapath.DataPath``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from app.blk.limits import QueueLimits
from app.blk.queue import BlockQueue
from app.blk.tuning import CryptSplit, Tuning
from app.crypto.keys import KeyMaterial
from app.crypto.transform import make_transform
from app.dm.datapath import DataPath, LiveMap
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
    Target,
    ZeroTarget,
    crypt_message,
)
from app.dm.timed import TimedDevice
from app.engine.base import Engine
from app.errors import InvalidInput, InvalidState, KeyNotSet
from app.vocab import DEFAULT_QUEUE_DEPTH, SECTOR_SIZE, DispatchMode, ElevatorName, VolumeState

DeviceResolver = Callable[[DeviceRef], BlockDevice]


def wipe_replaced_keys(old: Table, *kept_by: Table | None) -> None:
    """Zero the keys of ``old``'s crypt lines that no table of ``kept_by`` still holds."""
    kept = {
        id(line.target.key)
        for table in kept_by
        if table is not None
        for line in table.lines
        if isinstance(line.target, CryptParams)
    }
    for line in old.lines:
        params = line.target
        if (
            isinstance(params, CryptParams)
            and params.key is not None
            and id(params.key) not in kept
        ):
            params.key.wipe()


def queue_depth(device_depths: Iterable[int]) -> int:
    """A volume's tags: the fewest of any modelled device it maps (a device model's queue
    depth bounds what may be in flight to it), the default when it maps none."""
    return min(device_depths, default=DEFAULT_QUEUE_DEPTH)


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


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """What a volume's request queue would run with, for a volume with no live
    ``BlockQueue`` here (one only recorded in SQL)."""

    dispatch_mode: DispatchMode
    elevator: str
    limits: QueueLimits
    plug_window_us: int
    queue_depth: int


@dataclass(slots=True)
class VolumeInfo:
    name: str
    uuid: str
    state: VolumeState
    event_nr: int
    dispatch_mode: DispatchMode
    engine: str
    elevator: str
    limits: QueueLimits
    plug_window_us: int
    queue_depth: int
    crypt_split: CryptSplit
    has_live: bool
    has_inactive: bool
    size_sectors: int
    extra: dict[str, object] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        name: str,
        uuid: str,
        state: VolumeState,
        event_nr: int,
        *,
        queue: BlockQueue | QueueSettings,
        engine: str,
        live: Table | None,
        inactive: Table | None,
        crypt_split: CryptSplit,
    ) -> VolumeInfo:
        """The one way to describe a volume, whether served here (``Volume.info``) or only
        recorded in SQL: the same fields then come from the same places."""
        return cls(
            name=name,
            uuid=uuid,
            state=state,
            event_nr=event_nr,
            dispatch_mode=queue.dispatch_mode,
            engine=engine,
            elevator=queue.elevator,
            limits=queue.limits,
            plug_window_us=queue.plug_window_us,
            queue_depth=queue.queue_depth,
            crypt_split=crypt_split,
            has_live=live is not None,
            has_inactive=inactive is not None,
            size_sectors=live.size_sectors if live else 0,
        )


class Volume(DataPath):
    """One mapped device. Lifecycle calls are serialized by the caller (``lock``).

    ``tuning`` is the volume's queue tuning as recorded (its plug window may be
    None: the service default ``default_plug_window_us``).
    """

    def __init__(
        self,
        name: str,
        uuid: str,
        *,
        engine: Engine,
        tuning: Tuning | None = None,
        default_plug_window_us: int = 50,
        suspend_wait_seconds: float = 30.0,
        default_crypt_split: CryptSplit = (None, None),
    ) -> None:
        tuning = (tuning or Tuning()).validate()
        super().__init__(
            name,
            tuning=tuning,
            default_plug_window_us=default_plug_window_us,
            suspend_wait_seconds=suspend_wait_seconds,
            default_crypt_split=default_crypt_split,
        )
        self.uuid = uuid
        self.lock = threading.RLock()
        self.engine = engine
        self.tuning = tuning
        self.default_plug_window_us = default_plug_window_us
        self.default_crypt_split = default_crypt_split
        self.inactive: Table | None = None
        self.event_nr = 0
        #: Served by the NBD front end under this volume's name (set by the control plane).
        self.nbd_export = False

    @property
    def dispatch_mode(self) -> DispatchMode:
        return self.queue.dispatch_mode

    @property
    def elevator(self) -> ElevatorName:
        return self.queue.elevator

    # ------------------------------------------------------------------ lifecycle

    def tables(self) -> list[Table]:
        """The live table (if any), then the inactive one (if any): what the volume maps."""
        tables = [self.live.table] if self.live else []
        return tables + ([self.inactive] if self.inactive else [])

    def load(self, table: Table) -> None:
        """dmsetup load: the table goes to the inactive slot."""
        old, self.inactive = self.inactive, table
        if old is not None:
            wipe_replaced_keys(old, table, self.live.table if self.live else None)

    def clear_inactive(self) -> None:
        old, self.inactive = self.inactive, None
        if old is not None:
            wipe_replaced_keys(old, self.live.table if self.live else None)

    def check_resumable(self) -> None:
        table = self.inactive or (self.live.table if self.live else None)
        if table is None:
            raise InvalidState(f"volume {self.name} has no table to resume")
        line = missing_key(table)
        if line is not None:
            raise KeyNotSet(f"line {line}: crypt key is not set")

    def resume(self, resolve: DeviceResolver) -> None:
        """Swap the inactive table in (if any) and let I/O flow.

        On an active volume the swap is preceded by an implicit suspend, as
        dmsetup's resume does: new I/O waits at the gate and in-flight I/O
        finishes on the old table before its targets are wiped.
        """
        self.check_resumable()
        if self.inactive is not None:
            new_live = self._build(self.inactive, resolve)
            if self.state == "active":
                self._set_state("suspended")
                self.drain()
            old = self.live
            self.live = new_live
            self.inactive = None
            self.queue.set_boundaries([target.start for target in new_live.targets[1:]])
            self.queue.set_queue_depth(new_live.queue_depth)
            self.queue.set_overlapped(new_live.overlapped)
            self._apply_block_size(new_live.logical_block_size)
            if old is not None:
                for target in old.targets:
                    target.wipe()
                wipe_replaced_keys(old.table, new_live.table)
            self.versions.bump()
        self._set_state("active")
        self.queue.release()
        self.event_nr += 1

    def suspend(self, *, noflush: bool = False, timeout: float | None = None) -> None:
        """Hold new I/O; unless ``noflush``, first wait for in-flight I/O to finish."""
        self._set_state("suspended")
        if not noflush:
            self.drain(timeout)
        self.queue.hold()
        self.event_nr += 1

    def plan_message(self, words: Sequence[str], sector: int = 0) -> tuple[int, Table]:
        """dmsetup message to the target at ``sector``; only crypt takes messages.

        Validates and returns (line index, new live table) without applying it, so
        the caller can persist first.
        """
        if self.live is None:
            raise InvalidState(f"volume {self.name} has no live table")
        index = next(
            (i for i, t in enumerate(self.live.targets) if t.start <= sector < t.end), None
        )
        if index is None:
            raise InvalidInput(f"sector {sector} is beyond the table")
        line = self.live.table.lines[index]
        if not isinstance(line.target, CryptParams):
            raise InvalidInput(f"the target at sector {sector} is {line.target_type}, not crypt")
        new_params = crypt_message(line.target, words, suspended=self.state == "suspended")
        lines = list(self.live.table.lines)
        lines[index] = replace(line, target=new_params)
        return index, Table(tuple(lines))

    def apply_line(self, index: int, table: Table, resolve: DeviceResolver) -> None:
        """Install line ``index`` of ``table`` (a planned message) into the live map."""
        assert self.live is not None
        targets = list(self.live.targets)
        targets[index].wipe()
        targets[index] = self._target(table.lines[index], resolve)
        old_table = self.live.table
        self.live = replace(self.live, table=table, targets=targets)
        wipe_replaced_keys(old_table, table)
        self.event_nr += 1

    def install_suspended(self, table: Table, resolve: DeviceResolver) -> None:
        """Restore a live table at startup without letting I/O flow (its key may be wiped)."""
        self.live = self._build(table, resolve)
        self.queue.set_boundaries([target.start for target in self.live.targets[1:]])
        self.queue.set_queue_depth(self.live.queue_depth)
        self.queue.set_overlapped(self.live.overlapped)
        self._apply_block_size(self.live.logical_block_size)
        self.queue.hold()

    def retune(self, tuning: Tuning, engine: Engine | None = None) -> None:
        """Apply a new tuning live; only the knobs that changed are touched."""
        old = self.tuning
        self.tuning = tuning.validate()
        if tuning.plug_window_us != old.plug_window_us:
            self.queue.set_plug_window(tuning.plug_window(self.default_plug_window_us))
        if (tuning.max_read_size, tuning.max_write_size) != (
            old.max_read_size,
            old.max_write_size,
        ):
            self.set_crypt_split(tuning.crypt_split(self.default_crypt_split))
        if tuning.dispatch_mode != old.dispatch_mode:
            self.queue.set_dispatch_mode(tuning.dispatch_mode)
        if tuning.elevator != old.elevator:
            self.queue.set_elevator(tuning.elevator)
        if tuning.limits != old.limits:
            self._apply_block_size(self.live.logical_block_size if self.live else SECTOR_SIZE)
        if engine is not None:
            self.engine = engine
            for target in self.live.targets if self.live else ():
                if isinstance(target, CryptTarget):
                    target.engine = engine

    def remove(self) -> None:
        self.queue.hold()
        if self.live is not None:
            for target in self.live.targets:
                target.wipe()
            wipe_replaced_keys(self.live.table)
        if self.inactive is not None:
            wipe_replaced_keys(self.inactive)
        self.live = None
        self.inactive = None

    def _apply_block_size(self, block_size: int) -> None:
        self.queue.set_limits(self.tuning.limits_for(block_size))

    def _build(self, table: Table, resolve: DeviceResolver) -> LiveMap:
        targets: list[Target] = []
        depths: list[int] = []
        waiting: list[bool] = []

        def resolve_noting_depth(ref: DeviceRef) -> BlockDevice:
            device = resolve(ref)
            if isinstance(device, TimedDevice):
                depths.append(device.queue_depth)
                waiting.append(not device.device.prompt)
            else:
                waiting.append(not device.prompt)
            return device

        try:
            for line in table.lines:
                targets.append(self._target(line, resolve_noting_depth))
        except BaseException:
            for target in targets:
                target.wipe()
            raise
        return LiveMap(table, targets, table.logical_block_size, queue_depth(depths), any(waiting))

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

    def info(self) -> VolumeInfo:
        return VolumeInfo.of(
            self.name,
            self.uuid,
            self.state,
            self.event_nr,
            queue=self.queue,
            engine=self.engine.name,
            live=self.live.table if self.live else None,
            inactive=self.inactive,
            crypt_split=self.crypt_split,
        )
