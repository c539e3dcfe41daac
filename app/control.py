"""The control plane: the lifecycle rules for devices and volumes, persisted then mirrored.

Every lifecycle call runs under one lock (per process), validates, writes SQL in
its own transaction (``app.repository``), commits, and only then applies the
change to the in-memory volume, whose own steps are validated beforehand and
cannot fail half-way. So no interleaving and no failed commit can leave SQL and
memory disagreeing (ADR 0003). Who maps whom is ``app.dm.stacking``'s answer.
The data path never comes here.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from app.blk.tuning import Tuning, TuningPatch
from app.dm.stacking import StackingGraph, stacking_order
from app.dm.table import DeviceRef, ErrorParams, Table, TableLimits, TableLine, parse_table
from app.dm.targets import BlockDevice
from app.dm.timed import TimedDevice
from app.dm.volume import Volume, VolumeInfo, wipe_replaced_keys
from app.engine.base import Engine
from app.engine.registry import EngineRegistry
from app.errors import (
    AlreadyExists,
    DeviceBusy,
    DeviceNotFound,
    InsufficientStorage,
    InvalidInput,
    InvalidState,
    LeaseExpired,
    QuotaExceeded,
    ServedElsewhere,
    Unavailable,
    VolumeBusy,
    VolumeNotFound,
)
from app.repository import Lease, Records, RecordsTx, StoredDevice, StoredVolume
from app.storage.registry import DeviceRegistry, Placement
from app.vocab import DEFAULT_QUEUE_DEPTH, SECTOR_SIZE, StoreKind, is_valid_name

log = logging.getLogger("reqcrypt.control")


def check_name(kind: str, name: str) -> None:
    if not is_valid_name(name):
        raise InvalidInput(
            f"{kind} name must be 1-64 characters of letters, digits, '.', '_' or '-'"
        )


@dataclass(frozen=True, slots=True)
class ControlLimits:
    """What the service holds at most (REQCRYPT_MAX_*); checked before anything is written."""

    max_devices: int
    max_volumes: int
    max_device_bytes: int
    max_total_device_bytes: int
    max_table_lines: int
    max_table_line_length: int

    @property
    def table(self) -> TableLimits:
        return TableLimits(self.max_table_lines, self.max_table_line_length)


@dataclass(frozen=True, slots=True)
class Membership:
    """This process as one node of a cluster sharing the database (REQCRYPT_NODE_ID)."""

    node: str
    url: str
    lease_seconds: float


@dataclass(slots=True)
class Holding:
    """A lease this node holds: as the database granted it, and the local
    ``time.monotonic()`` deadline (measured from before the statement was sent)."""

    lease: Lease
    deadline: float


@dataclass(frozen=True, slots=True)
class RecordedVolume:
    """A volume as SQL records it: what a node that does not serve it can tell."""

    info: VolumeInfo
    targets: tuple[tuple[int, int, str, str], ...]
    """(start, length, target type, parameters with keys hidden) of each live line."""
    maps: tuple[frozenset[str], ...]
    """``DeviceRef.key`` of everything each of its tables (live, inactive) maps."""
    nbd_export: bool


def device_names(tables: Sequence[Table]) -> set[str]:
    return {ref.name for table in tables for ref in table.device_refs() if ref.kind == "device"}


class Control:
    """The lifecycle of the devices and volumes this process serves.

    One node (no ``membership``) serves every volume. A cluster node serves the
    volumes it holds a lease on (``held``): ``app.cluster`` adopts and drops them,
    every lifecycle write re-checks the lease in its own transaction, and each held
    volume's devices are claimed (``BackingStore.claim``) so no other node can use them.
    """

    def __init__(
        self,
        records: Records,
        devices: DeviceRegistry,
        engines: EngineRegistry,
        *,
        plug_window_us: int,
        suspend_wait_seconds: float,
        limits: ControlLimits,
        membership: Membership | None = None,
    ) -> None:
        self.records = records
        self.membership = membership
        self.held: dict[str, Holding] = {}
        """uuid: the lease of every volume this cluster node serves."""
        self._claimed: dict[str, set[str]] = {}
        """uuid: the devices claimed for that volume."""
        self.limits = limits
        self.devices = devices
        self.engines = engines
        self.plug_window_us = plug_window_us
        self.suspend_wait_seconds = suspend_wait_seconds
        self.volumes: dict[str, Volume] = {}
        self.stacking = StackingGraph(self.volumes)
        self.device_sizes: dict[str, int] = {}
        self.device_models: dict[str, str | None] = {}
        self.device_placements: dict[str, Placement] = {}
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ plumbing

    def volume(self, name: str) -> Volume:
        try:
            return self.volumes[name]
        except KeyError:
            raise VolumeNotFound(f"volume {name} not found") from None

    def device_size_sectors(self, ref: DeviceRef) -> int:
        if ref.kind == "device":
            if ref.name not in self.device_sizes:
                raise DeviceNotFound(f"device {ref.name} not found")
            return self.device_sizes[ref.name] // SECTOR_SIZE
        return self._lower(ref.name).size // SECTOR_SIZE

    def resolve(self, ref: DeviceRef) -> BlockDevice:
        """The object a table line maps onto; modelled devices accrue virtual time."""
        if ref.kind == "device":
            store = self.devices.get(ref.name)
            model = self.device_models.get(ref.name)
            if model is None:
                return store
            return TimedDevice(store, self.engines.device_timer(model))
        return self._lower(ref.name)

    def _lower(self, name: str) -> Volume:
        """A volume a table maps. A cluster node can only stack onto a volume it serves:
        one another node serves is a conflict, named as such, not a missing volume."""
        volume = self.volumes.get(name)
        if volume is not None or self.membership is None:
            return self.volume(name)
        with self.records.transaction() as records:
            node = records.owner_node(name)
        raise ServedElsewhere(
            f"volume {name} is served by node {node or '(none yet)'}, not this one: a volume "
            f"that maps /dev/mapper/{name} must be served by the same node (create it "
            f"through any node, it is placed there; or move volume {name} here first)"
        )

    @contextmanager
    def _volume_tx(self, volume: Volume) -> Iterator[RecordsTx]:
        """A lifecycle transaction on ``volume``; a cluster node first re-checks (and
        row-locks) its lease, so a node that lost the volume writes nothing."""
        with self.records.transaction() as records:
            if self.membership is not None:
                holding = self.held.get(volume.uuid)
                if holding is None or not records.hold_lease(
                    volume.uuid, self.membership.node, holding.lease.epoch
                ):
                    raise LeaseExpired(
                        f"this node no longer holds the lease on volume {volume.name}"
                    )
            yield records

    def _claim(self, uuid: str, tables: Sequence[Table], *, take_over: bool = False) -> None:
        """Claim the devices ``tables`` map that this node has not claimed yet."""
        if self.membership is None:
            return
        mine = set().union(*self._claimed.values())
        taken: list[str] = []
        try:
            for name in sorted(device_names(tables) - mine):
                self.devices.get(name).claim(take_over=take_over)
                taken.append(name)
        except BaseException:
            for name in taken:
                self.devices.get(name).release()
            raise
        self._claimed[uuid] = (
            self._claimed.get(uuid, set()) | set(taken) | (device_names(tables) & mine)
        )

    def _unclaim(self, uuid: str, kept: Sequence[Table]) -> None:
        """Release the devices only ``uuid`` claimed that ``kept`` no longer maps."""
        if self.membership is None:
            return
        keep = device_names(kept)
        dropped = self._claimed.pop(uuid, set()) - keep
        if keep:
            self._claimed[uuid] = keep
        others = set().union(*self._claimed.values())
        for name in dropped - others:
            if name in self.device_sizes:
                self.devices.get(name).release()

    # ------------------------------------------------------------------ devices

    def create_device(
        self,
        name: str,
        size_bytes: int,
        model: str | None,
        *,
        store: StoreKind = "file",
        pool: str | None = None,
    ) -> None:
        """Register a device: a sparse file, or an RBD image in ``pool`` (store rbd)."""
        check_name("device", name)
        if size_bytes <= 0 or size_bytes % SECTOR_SIZE:
            raise InvalidInput("size_bytes must be a positive multiple of 512")
        if size_bytes > self.limits.max_device_bytes:
            raise InvalidInput(
                f"size_bytes {size_bytes} exceeds the {self.limits.max_device_bytes}-byte "
                "maximum (REQCRYPT_MAX_DEVICE_BYTES)"
            )
        if model is not None:
            self.engines.device_model(model)
        placement = self.devices.placement(name, store, pool)
        with self._lock:
            if self.membership is not None:
                self.sync_devices()
            if name in self.device_sizes:
                raise AlreadyExists(f"device {name} exists")
            self._check_device_quota(size_bytes)
            try:
                with self.records.transaction() as records:
                    records.add_device(
                        StoredDevice(
                            name,
                            size_bytes,
                            model,
                            placement.store,
                            placement.pool,
                            placement.image,
                        )
                    )
                    self.devices.create(name, size_bytes, placement)
            except BaseException:
                self.devices.remove(name)  # no row refers to the file or image: drop it
                raise
            self.device_sizes[name] = size_bytes
            self.device_models[name] = model
            self.device_placements[name] = placement

    def _check_device_quota(self, size_bytes: int) -> None:
        if len(self.device_sizes) >= self.limits.max_devices:
            raise QuotaExceeded(
                f"the service holds at most {self.limits.max_devices} devices "
                "(REQCRYPT_MAX_DEVICES); delete one first"
            )
        total = sum(self.device_sizes.values()) + size_bytes
        if total > self.limits.max_total_device_bytes:
            raise InsufficientStorage(
                f"devices would total {total} bytes; at most "
                f"{self.limits.max_total_device_bytes} (REQCRYPT_MAX_TOTAL_DEVICE_BYTES)"
            )

    def delete_device(self, name: str) -> None:
        with self._lock:
            if name not in self.device_sizes:
                raise DeviceNotFound(f"device {name} not found")
            users = self.stacking.users_of(name)
            if users:
                raise DeviceBusy(f"device {name} is mapped by volume(s) {', '.join(users)}")
            self.devices.check_removable(name)
            if self.membership is not None:  # a volume on another node maps it: claimed
                self.devices.get(name).claim()
            with self.records.transaction() as records:
                records.delete_device(name)
            # after the commit: a crash in between leaves an orphan file or image, never
            # a row whose file or image is gone
            self.devices.remove(name)
            del self.device_sizes[name]
            del self.device_models[name]
            del self.device_placements[name]

    def device_info(self, name: str) -> dict[str, Any]:
        if name not in self.device_sizes:
            raise DeviceNotFound(f"device {name} not found")
        placement = self.device_placements[name]
        return {
            "name": name,
            "size_bytes": self.device_sizes[name],
            "allocated_bytes": self.devices.get(name).allocated_bytes(),
            "model": self.device_models[name],
            "store": placement.store,
            "pool": placement.pool,
            "image": placement.image,
            "mapped_by": self.stacking.users_of(name),
        }

    # ------------------------------------------------------------------ volumes

    def _parse(self, name: str, text: str, engine: Engine) -> Table:
        table = parse_table(text, resolve=self, limits=self.limits.table)
        if self.stacking.would_cycle(name, table):
            raise InvalidInput(f"table would make volume {name} map onto itself")
        check_engine(engine, table)
        return table

    def create_volume(
        self,
        name: str,
        table_text: str,
        *,
        engine: str = "software",
        tuning: Tuning | None = None,
        nbd_export: bool = False,
    ) -> Volume:
        """dmsetup create: load + resume. A plug window of None follows the service default."""
        check_name("volume", name)
        tuning = (tuning or Tuning()).validate()
        engine_obj = self.engines.engine(engine)
        with self._lock:
            if name in self.volumes:
                raise AlreadyExists(f"volume {name} exists")
            if len(self.volumes) >= self.limits.max_volumes:
                raise QuotaExceeded(
                    f"the service holds at most {self.limits.max_volumes} volumes "
                    "(REQCRYPT_MAX_VOLUMES); remove one first"
                )
            if self.membership is not None:
                self.sync_devices()
            table = self._parse(name, table_text, engine_obj)
            volume = self._new_volume(name, str(uuid.uuid4()), engine_obj, tuning)
            volume.nbd_export = nbd_export
            volume.load(table)
            volume.check_resumable()
            started = time.monotonic()
            self._claim(volume.uuid, [table])
            try:
                with self.records.transaction() as records:
                    records.add_volume(
                        name,
                        volume.uuid,
                        engine=engine,
                        tuning=tuning,
                        live=table,
                        nbd_export=nbd_export,
                    )
                    if self.membership is not None:
                        lease = records.own_new(
                            volume.uuid, self.membership.node, self.membership.lease_seconds
                        )
                    volume.resume(self.resolve)
            except BaseException:
                self._unclaim(volume.uuid, [])
                raise
            if self.membership is not None:
                deadline = started + self.membership.lease_seconds
                self.held[volume.uuid] = Holding(lease, deadline)
                volume.hold_lease_until(deadline)
            self.volumes[name] = volume
            return volume

    def _new_volume(self, name: str, uuid: str, engine: Engine, tuning: Tuning) -> Volume:
        return Volume(
            name,
            uuid,
            engine=engine,
            tuning=tuning,
            default_plug_window_us=self.plug_window_us,
            suspend_wait_seconds=self.suspend_wait_seconds,
        )

    def load_table(self, name: str, table_text: str) -> None:
        with self._lock:
            volume = self.volume(name)
            table = self._parse(name, table_text, volume.engine)
            self._claim(volume.uuid, [table])
            try:
                with self._volume_tx(volume) as records:
                    records.load_inactive(name, table)
            except BaseException:
                self._unclaim(volume.uuid, volume.tables())
                raise
            volume.load(table)

    def clear_inactive(self, name: str) -> None:
        with self._lock:
            volume = self.volume(name)
            with self._volume_tx(volume) as records:
                records.clear_inactive(name)
            volume.clear_inactive()
            self._unclaim(volume.uuid, volume.tables())

    def suspend(self, name: str, *, noflush: bool) -> None:
        with self._lock:
            volume = self.volume(name)
            with volume.lock:
                if volume.state == "suspended":
                    return
                with self._volume_tx(volume) as records:
                    records.set_state(name, "suspended", volume.event_nr + 1)
                volume.suspend(noflush=noflush, timeout=self.suspend_wait_seconds)

    def resume(self, name: str) -> None:
        with self._lock:
            volume = self.volume(name)
            with volume.lock:
                volume.check_resumable()
                new_table = volume.inactive
                if new_table is not None:
                    for ref in new_table.device_refs():
                        self.resolve(ref)
                with self._volume_tx(volume) as records:
                    if new_table is not None:
                        records.promote_inactive(name)
                    records.set_state(name, "active", volume.event_nr + 1)
                volume.resume(self.resolve)
                self._unclaim(volume.uuid, volume.tables())

    def message(self, name: str, text: str, sector: int = 0) -> None:
        words = text.split()
        with self._lock:
            volume = self.volume(name)
            with volume.lock:
                index, table = volume.plan_message(words, sector)
                with self._volume_tx(volume) as records:
                    records.replace_live(name, table, volume.event_nr + 1)
                volume.apply_line(index, table, self.resolve)

    def rename(self, name: str, new_name: str) -> None:
        check_name("volume", new_name)
        with self._lock:
            volume = self.volume(name)
            if new_name in self.volumes:
                raise AlreadyExists(f"volume {new_name} exists")
            users = self.stacking.volume_users(name)
            if users:
                raise VolumeBusy(
                    f"volume {name} is mapped by volume(s) {', '.join(users)}; rename it later"
                )
            with self._volume_tx(volume) as records:
                records.rename_volume(name, new_name)
            volume.name = new_name
            self.volumes[new_name] = self.volumes.pop(name)

    def remove(self, name: str, *, force: bool = False) -> None:
        with self._lock:
            volume = self.volume(name)
            users = self.stacking.volume_users(name)
            if users:
                raise VolumeBusy(f"volume {name} is mapped by volume(s) {', '.join(users)}")
            if volume.in_flight and not force:
                raise VolumeBusy(f"volume {name} has {volume.in_flight} I/Os in flight")
            if force and volume.live is not None:
                error_table = Table(
                    (TableLine(0, volume.live.table.size_sectors, "error", ErrorParams()),)
                )
                volume.load(error_table)
                volume.resume(self.resolve)
            with self._volume_tx(volume) as records:
                records.delete_volume(name)
            volume.remove()
            del self.volumes[name]
            self._unclaim(volume.uuid, [])
            self.held.pop(volume.uuid, None)

    def retune(self, name: str, *, engine: str | None = None, patch: TuningPatch) -> None:
        engine_obj = self.engines.engine(engine) if engine is not None else None
        with self._lock:
            volume = self.volume(name)
            tuning = patch.apply(volume.tuning)
            if engine_obj is not None:
                for table in volume.tables():
                    check_engine(engine_obj, table)
            with self._volume_tx(volume) as records:
                records.retune(name, engine=engine or volume.engine.name, tuning=tuning)
            volume.retune(tuning, engine_obj)

    def set_nbd_export(self, name: str, nbd_export: bool) -> None:
        """Serve the volume over NBD, or stop (its NBD connections then close)."""
        with self._lock:
            volume = self.volume(name)
            with self._volume_tx(volume) as records:
                records.set_nbd_export(name, nbd_export)
            volume.nbd_export = nbd_export

    # ------------------------------------------------------------------ restart

    def restore(self) -> None:
        """Rebuild devices and volumes from SQL, stacked volumes after what they map."""
        if self.membership is not None:  # a cluster node adopts volumes as it takes leases
            self.sync_devices()
            return
        with self.records.transaction() as records:
            devices = records.devices()
            stored = {volume.name: volume for volume in records.volumes()}
        for device in devices:
            placement = Placement(device.store, device.pool, device.image)
            self.devices.open(device.name, device.size_bytes, placement)
            self.device_sizes[device.name] = device.size_bytes
            self.device_models[device.name] = device.model
            self.device_placements[device.name] = placement
        order, stranded = stacking_order(
            {name: [t for t in (v.live, v.inactive) if t is not None] for name, v in stored.items()}
        )
        if stranded:
            raise InvalidState(
                "cannot restore volumes mapping missing volumes: " + ", ".join(stranded)
            )
        for name in order:
            self._restore_volume(stored[name])

    def _restore_volume(self, stored: StoredVolume) -> None:
        volume = self._new_volume(
            stored.name, stored.uuid, self.engines.engine(stored.engine), stored.tuning
        )
        if stored.live is not None:
            if stored.state == "active":
                volume.load(stored.live)
                volume.resume(self.resolve)
            else:
                volume.install_suspended(stored.live, self.resolve)
        if stored.inactive is not None:
            volume.load(stored.inactive)
        volume.event_nr = stored.event_nr
        volume.nbd_export = stored.nbd_export
        self.volumes[stored.name] = volume

    # ------------------------------------------------------------------ cluster

    def sync_devices(self) -> None:
        """Open the devices other nodes registered; forget those they deleted."""
        with self.records.transaction() as records:
            devices = {device.name: device for device in records.devices()}
        with self._lock:
            for name, device in devices.items():
                if name not in self.device_sizes:
                    placement = Placement(device.store, device.pool, device.image)
                    self.devices.open(name, device.size_bytes, placement)
                    self.device_sizes[name] = device.size_bytes
                    self.device_models[name] = device.model
                    self.device_placements[name] = placement
            for name in list(self.device_sizes):
                if name not in devices and not self.stacking.users_of(name):
                    self.devices.forget(name)
                    del self.device_sizes[name]
                    del self.device_models[name]
                    del self.device_placements[name]

    def adopt(self, lease: Lease, deadline: float, *, take_over: bool) -> Volume:
        """Serve a volume whose lease this node just took: claim its devices (fencing a
        previous holder with ``take_over``; ``DeviceClaimed`` if one is still alive),
        rebuild it from SQL, and admit I/O until ``deadline``."""
        with self._lock:
            self.sync_devices()
            with self.records.transaction() as records:
                stored = records.volume(lease.uuid)
            if stored.name in self.volumes:
                raise AlreadyExists(f"volume {stored.name} exists")
            tables = [t for t in (stored.live, stored.inactive) if t is not None]
            self._claim(lease.uuid, tables, take_over=take_over)
            try:
                self._restore_volume(stored)
            except BaseException:
                self._unclaim(lease.uuid, [])
                raise
            volume = self.volumes[stored.name]
            volume.hold_lease_until(deadline)
            self.held[lease.uuid] = Holding(lease, deadline)
            return volume

    def renewed(
        self, asked: Mapping[str, int], leases: dict[str, Lease], deadline: float
    ) -> list[Volume]:
        """Apply a renewal of ``asked`` (uuid: epoch): extend what was renewed; fence what
        was not, at once, and return those volumes for ``drop``. A volume created since
        the renewal was asked is left alone. Takes no lock: a lifecycle call holding the
        control lock (a suspend draining for seconds) must never delay a renewal."""
        lost = []
        for volume in list(self.volumes.values()):
            holding = self.held.get(volume.uuid)
            if holding is None or asked.get(volume.uuid) != holding.lease.epoch:
                continue
            lease = leases.get(volume.uuid)
            if lease is not None:
                self.held[volume.uuid] = Holding(lease, deadline)
                volume.hold_lease_until(deadline)
            else:
                del self.held[volume.uuid]
                volume.hold_lease_until(-math.inf)
                lost.append(volume)
        return lost

    def recorded_volumes(self) -> list[RecordedVolume]:
        """Every volume of the cluster as SQL records it, by name; keys wiped once read."""
        with self.records.transaction() as records:
            stored = records.volumes()
        recorded = []
        for volume in sorted(stored, key=lambda volume: volume.name):
            tables = [t for t in (volume.live, volume.inactive) if t is not None]
            recorded.append(
                RecordedVolume(
                    self.recorded_info(volume),
                    tuple(
                        (
                            line.start,
                            line.length,
                            line.target_type,
                            line.target.format(show_keys=False),
                        )
                        for line in (volume.live.lines if volume.live else ())
                    ),
                    tuple(frozenset(table.devices()) for table in tables),
                    volume.nbd_export,
                )
            )
            for table in tables:
                wipe_replaced_keys(table)
        return recorded

    def recorded_info(self, stored: StoredVolume) -> VolumeInfo:
        """What ``Volume.info`` would say of a volume another node serves, from its record:
        every lifecycle change is committed to SQL before the owner applies it."""
        tuning = stored.tuning
        block_size = stored.live.logical_block_size if stored.live else SECTOR_SIZE
        models = [
            self.device_models.get(ref.name)
            for ref in (stored.live.device_refs() if stored.live else ())
            if ref.kind == "device"
        ]
        known = {model.name: model.queue_depth for model in self.engines.device_models()}
        depths = [known[model] for model in models if model in known]
        return VolumeInfo(
            name=stored.name,
            uuid=stored.uuid,
            state=stored.state,
            event_nr=stored.event_nr,
            dispatch_mode=tuning.dispatch_mode,
            engine=stored.engine,
            elevator=tuning.elevator,
            limits=tuning.limits_for(block_size),
            plug_window_us=tuning.plug_window(self.plug_window_us),
            queue_depth=min(depths, default=DEFAULT_QUEUE_DEPTH),
            has_live=stored.live is not None,
            has_inactive=stored.inactive is not None,
            size_sectors=stored.live.size_sectors if stored.live else 0,
        )

    def _rbd_devices(self, tables: Sequence[Table]) -> set[str]:
        return {
            name
            for name in device_names(tables)
            if self.device_placements.get(name, Placement()).store == "rbd"
        }

    def fence_rbd(self) -> list[tuple[str, Lease | None]]:
        """The Ceph client was blocklisted: fence at once every volume mapping an RBD device
        (and every volume stacked on one) and stop holding its lease. Returns (name, lease
        held or None) for the caller to release and ``drop``. Takes no lock, as ``renewed``."""
        names = {
            name
            for name, volume in list(self.volumes.items())
            if self._rbd_devices(volume.tables())
        }
        waiting = list(names)
        while waiting:
            for user in self.stacking.volume_users(waiting.pop()):
                if user not in names:
                    names.add(user)
                    waiting.append(user)
        fenced: list[tuple[str, Lease | None]] = []
        for name in sorted(names):
            volume = self.volumes.get(name)
            if volume is None:  # removed meanwhile
                continue
            volume.hold_lease_until(-math.inf)
            holding = self.held.pop(volume.uuid, None)
            fenced.append((name, None if holding is None else holding.lease))
        return fenced

    def maps_rbd(self, uuid: str) -> bool:
        """Does the recorded volume map an RBD device? (A fenced node must not take it.)"""
        self.sync_devices()
        with self.records.transaction() as records:
            stored = records.volume(uuid)
        tables = [t for t in (stored.live, stored.inactive) if t is not None]
        for table in tables:
            wipe_replaced_keys(table)
        return bool(self._rbd_devices(tables))

    def reconnect_ceph(self) -> None:
        """Open every RBD device again on a new Ceph connection (the old one blocklisted);
        the volumes that mapped one are dropped already."""
        with self._lock:
            self.devices.reconnect_ceph(
                {
                    name: (self.device_sizes[name], placement)
                    for name, placement in self.device_placements.items()
                    if placement.store == "rbd"
                }
            )

    @contextmanager
    def lock_unless_busy(self) -> Iterator[bool]:
        """The control lock if it is free now (True), else nothing (False)."""
        acquired = self._lock.acquire(blocking=False)
        try:
            yield acquired
        finally:
            if acquired:
                self._lock.release()

    def drop(self, name: str, *, graceful: bool) -> Lease | None:
        """Stop serving a volume (its row stays): fence it, let in-flight I/O finish, and
        — when ``graceful`` (a move, a clean stop) — make it durable; then release its
        devices. A lost lease is never graceful: nothing more is written for it.
        Returns the lease it held (None: already lost)."""
        with self._lock:
            volume = self.volume(name)
            holding = self.held.pop(volume.uuid, None)
            with volume.lock:
                volume.hold_lease_until(-math.inf)
                try:
                    volume.drain(self.suspend_wait_seconds)
                except Unavailable:
                    log.warning("volume %s: dropped with I/O still in flight", name)
                if graceful:
                    for device in sorted(self._claimed.get(volume.uuid, ())):
                        self.devices.get(device).flush()
                volume.nbd_export = False  # its NBD connections close
                volume.remove()
                del self.volumes[name]
                self._unclaim(volume.uuid, [])
            return None if holding is None else holding.lease

    def close(self) -> None:
        with self._lock:
            for volume in self.volumes.values():
                volume.remove()
            self.volumes.clear()
            self.devices.close()


def check_engine(engine: Engine, table: Table) -> None:
    """Refuse a table the engine could never process (cipher, chain mode, data unit size)."""
    for params in table.crypt_params():
        engine.check(params.cipher, params.sector_size)
