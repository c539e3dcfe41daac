"""The volume lifecycle: dmsetup's calls on the devices and volumes this process serves,
persisted then mirrored.

Every lifecycle call runs under one lock (per process), validates, writes SQL in
its own transaction (``app.db.records``), commits, and only then applies the
change to the in-memory volume, whose own steps are validated beforehand and
cannot fail half-way. So no interleaving and no failed commit can leave SQL and
memory disagreeing (ADR 0003). Who maps whom is ``app.dm.stacking``'s answer;
which volumes this process may serve and write is the ``Guard``'s. The data path
reaches a volume through ``volume`` (one dict lookup) and never takes the lock.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from app.blk.tuning import CryptSplit, Tuning, TuningPatch
from app.config import ControlSettings
from app.control.catalog import CatalogedDevice, DeviceCatalog
from app.control.guard import Guard, SingleNode
from app.control.recorded import RecordedVolumes
from app.control.restore import restore
from app.db.records import Records, RecordsTx, StoredDevice, StoredVolume
from app.dm.stacking import StackingGraph
from app.dm.table import DeviceRef, ErrorParams, Table, TableLimits, TableLine, parse_table
from app.dm.targets import BlockDevice
from app.dm.volume import Volume, wipe_replaced_keys
from app.engine.base import Engine
from app.engine.registry import EngineRegistry
from app.errors import (
    AlreadyExists,
    DeviceBusy,
    DeviceClaimed,
    InvalidInput,
    QuotaExceeded,
    Unavailable,
    VolumeBusy,
    VolumeNotFound,
)
from app.storage.base import BackingStore
from app.storage.registry import DeviceRegistry
from app.vocab import SECTOR_SIZE, StoreKind, is_valid_name

log = logging.getLogger("reqcrypt.control")


def check_name(kind: str, name: str) -> None:
    if not is_valid_name(name):
        raise InvalidInput(
            f"{kind} name must be 1-64 characters of letters, digits, '.', '_' or '-'"
        )


def device_names(tables: Sequence[Table]) -> set[str]:
    return {ref.name for table in tables for ref in table.device_refs() if ref.kind == "device"}


class Control:
    """The lifecycle of the devices and volumes this process serves.

    One node serves every volume (``SingleNode``); a cluster node serves the volumes its
    guard holds a lease on, and every lifecycle write re-checks the guard in its own
    transaction.
    """

    def __init__(
        self,
        records: Records,
        devices: DeviceRegistry,
        engines: EngineRegistry,
        settings: ControlSettings,
        guard: Guard | None = None,
    ) -> None:
        self.records = records
        self.settings = settings
        self.table_limits = TableLimits(settings.max_table_lines, settings.max_table_line_length)
        self.guard: Guard = guard or SingleNode()
        self.devices = devices
        self.engines = engines
        self.catalog = DeviceCatalog(devices, engines)
        self.volumes: dict[str, Volume] = {}
        self.stacking = StackingGraph(self.volumes)
        self.crypt_split: CryptSplit = (settings.crypt_max_read_size, settings.crypt_max_write_size)
        self.recorded = RecordedVolumes(
            records,
            self.catalog,
            engines,
            plug_window_us=settings.plug_window_us,
            crypt_split=self.crypt_split,
        )
        self._lock = threading.RLock()
        self._held: dict[str, int] = {}
        """Devices a LUKS operation is reading or writing outside the lock (``holding``)."""

    # ------------------------------------------------------------------ plumbing

    def volume(self, name: str) -> Volume:
        try:
            return self.volumes[name]
        except KeyError:
            raise VolumeNotFound(f"volume {name} not found") from None

    def device_size_sectors(self, ref: DeviceRef) -> int:
        if ref.kind == "device":
            return self.catalog.size_sectors(ref.name)
        return self._lower(ref.name).size // SECTOR_SIZE

    def resolve(self, ref: DeviceRef) -> BlockDevice:
        """The object a table line maps onto; modelled devices accrue virtual time."""
        if ref.kind == "device":
            return self.catalog.resolve(ref.name)
        return self._lower(ref.name)

    def _lower(self, name: str) -> Volume:
        """A volume a table maps: only one this process serves (the guard says why not)."""
        volume = self.volumes.get(name)
        if volume is None:
            raise self.guard.not_served(name)
        return volume

    @contextmanager
    def _volume_tx(self, volume: Volume) -> Iterator[RecordsTx]:
        """A lifecycle transaction on ``volume``, the guard checked first: a process that
        may no longer write for it writes nothing."""
        with self.records.transaction() as records:
            self.guard.check(records, volume)
            yield records

    def _claim(self, uuid: str, tables: Sequence[Table], *, take_over: bool = False) -> None:
        self.guard.claim(uuid, device_names(tables), take_over=take_over)

    def _unclaim(self, uuid: str, kept: Sequence[Table]) -> None:
        self.guard.release(uuid, device_names(kept))

    def _sync_if_shared(self) -> None:
        if self.guard.shared:
            self.sync_devices()

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
        if size_bytes > self.settings.max_device_bytes:
            raise InvalidInput(
                f"size_bytes {size_bytes} exceeds the {self.settings.max_device_bytes}-byte "
                "maximum (REQCRYPT_MAX_DEVICE_BYTES)"
            )
        if model is not None:
            self.engines.device_model(model)
        placement = self.devices.placement(name, store, pool)
        with self._lock:
            self._sync_if_shared()
            if name in self.catalog:
                raise AlreadyExists(f"device {name} exists")
            self.catalog.check_quota(
                size_bytes,
                max_devices=self.settings.max_devices,
                max_total_bytes=self.settings.max_total_device_bytes,
            )
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
            self.catalog.add(CatalogedDevice(name, size_bytes, model, placement))

    def _refuse_mapped(self, name: str) -> None:
        """``DeviceBusy`` if a volume here maps device ``name`` (which must exist)."""
        self.catalog.get(name)
        users = self.stacking.users_of(name)
        if users:
            raise DeviceBusy(f"device {name} is mapped by volume(s) {', '.join(users)}")

    def delete_device(self, name: str) -> None:
        with self._lock:
            self._refuse_mapped(name)
            if self._held.get(name):
                raise DeviceBusy(
                    f"device {name} is in use by a LUKS operation; delete it once that ends"
                )
            self.devices.check_removable(name)
            self.guard.claim_unmapped(name)
            with self.records.transaction() as records:
                records.delete_device(name)
            # after the commit: a crash in between leaves an orphan file or image, never
            # a row whose file or image is gone
            self.catalog.remove(name)

    def known_device(self, name: str) -> None:
        """``DeviceNotFound`` unless device ``name`` exists; on a shared database the
        devices are re-read first when it is not known here (made through another node)."""
        with self._lock:
            if name not in self.catalog:
                self._sync_if_shared()
            self.catalog.get(name)

    @contextmanager
    def holding(self, name: str) -> Iterator[BackingStore]:
        """Device ``name`` for a LUKS operation that reads or writes its header outside the
        lock (a key derivation takes seconds): it cannot be deleted meanwhile, so its file
        descriptor stays its own (``DeviceBusy`` for a delete)."""
        with self._lock:
            self.known_device(name)
            self._held[name] = self._held.get(name, 0) + 1
        try:
            yield self.devices.get(name)
        finally:
            with self._lock:
                self._held[name] -= 1
                if not self._held[name]:
                    del self._held[name]

    def check_header_change(self, name: str, *, unmapped: bool) -> None:
        """Before the LUKS header of device ``name`` changes here. ``unmapped`` (luksFormat):
        ``DeviceBusy`` if a volume here maps it. On a shared database, ``DeviceClaimed`` if
        a volume another node serves maps it: its header changes only on that node."""
        with self._lock:
            self.known_device(name)
            if unmapped:
                self._refuse_mapped(name)
            if not self.guard.shared:
                return
            elsewhere = [
                recorded.info.name
                for recorded in self.recorded.all()
                if recorded.info.name not in self.volumes
                and any(name in mapped for mapped in recorded.maps)
            ]
        if elsewhere:
            raise DeviceClaimed(
                f"device {name} is mapped by volume(s) {', '.join(elsewhere)}, served by "
                "another cluster node: change its LUKS header on the node serving them"
            )

    def device_names(self) -> list[str]:
        return self.catalog.names()

    def device_info(self, name: str) -> dict[str, Any]:
        return {**self.catalog.info(name), "mapped_by": self.stacking.users_of(name)}

    # ------------------------------------------------------------------ volumes

    def _parse(self, name: str, text: str, engine: Engine) -> Table:
        table = parse_table(text, resolve=self, limits=self.table_limits)
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
            if len(self.volumes) >= self.settings.max_volumes:
                raise QuotaExceeded(
                    f"the service holds at most {self.settings.max_volumes} volumes "
                    "(REQCRYPT_MAX_VOLUMES); remove one first"
                )
            self._sync_if_shared()
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
                    committed = self.guard.own_new(records, volume, started)
                    volume.resume(self.resolve)
            except BaseException:
                self._unclaim(volume.uuid, [])
                raise
            committed()
            self.volumes[name] = volume
            return volume

    def _new_volume(self, name: str, uuid: str, engine: Engine, tuning: Tuning) -> Volume:
        return Volume(
            name,
            uuid,
            engine=engine,
            tuning=tuning,
            default_plug_window_us=self.settings.plug_window_us,
            suspend_wait_seconds=self.settings.suspend_wait_seconds,
            default_crypt_split=self.crypt_split,
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
                volume.suspend(noflush=noflush, timeout=self.settings.suspend_wait_seconds)

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
            self.guard.forget(volume)

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

    # ------------------------------------------------------------------ serving

    def restore(self) -> None:
        """Rebuild devices and volumes from SQL (``app.control.restore``). A process whose
        database is shared only opens the devices: it serves what its guard takes."""
        if self.guard.shared:
            self.sync_devices()
            return
        restore(self)

    def serve(self, stored: StoredVolume) -> Volume:
        """Rebuild a recorded volume as it was and serve it."""
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
        return volume

    def sync_devices(self) -> None:
        """Open the devices other processes recorded; forget those they deleted."""
        with self.records.transaction() as records:
            devices = records.devices()
        with self._lock:
            self.catalog.sync(devices, lambda name: bool(self.stacking.users_of(name)))

    def adopt(self, uuid: str, *, take_over: bool) -> Volume:
        """Serve a recorded volume: claim its devices (``take_over`` fences a dead previous
        holder; ``DeviceClaimed`` if one is still alive) and rebuild it from SQL."""
        with self._lock:
            self.sync_devices()
            with self.records.transaction() as records:
                stored = records.volume(uuid)
            if stored.name in self.volumes:
                raise AlreadyExists(f"volume {stored.name} exists")
            self._claim(
                uuid,
                [t for t in (stored.live, stored.inactive) if t is not None],
                take_over=take_over,
            )
            try:
                return self.serve(stored)
            except BaseException:
                self._unclaim(uuid, [])
                raise

    def recorded_devices(self, uuid: str) -> set[str]:
        """The devices the recorded volume ``uuid`` maps (keys wiped once read)."""
        self.sync_devices()
        with self.records.transaction() as records:
            stored = records.volume(uuid)
        tables = [t for t in (stored.live, stored.inactive) if t is not None]
        names = device_names(tables)
        for table in tables:
            wipe_replaced_keys(table)
        return names

    def stop_serving(self, name: str, *, graceful: bool) -> Volume:
        """Stop serving a volume (its row stays): end its lease deadline now (every new I/O
        is refused), let in-flight I/O finish, and
        — when ``graceful`` (a move, a clean stop) — make it durable; then the guard
        forgets it. A volume whose lease is lost is never graceful: nothing more is
        written for it."""
        with self._lock:
            volume = self.volume(name)
            with volume.lock:
                volume.hold_lease_until(-math.inf)
                try:
                    volume.drain(self.settings.suspend_wait_seconds)
                except Unavailable:
                    log.warning("volume %s: dropped with I/O still in flight", name)
                if graceful:
                    for device in sorted(device_names(volume.tables())):
                        self.devices.get(device).flush()
                volume.nbd_export = False  # its NBD connections close
                volume.remove()
                del self.volumes[name]
                self.guard.forget(volume)
            return volume

    def reconnect_ceph(self) -> None:
        """Open every RBD device again on a new Ceph connection (the old one blocklisted)."""
        with self._lock:
            self.catalog.reconnect_ceph()

    @contextmanager
    def lock_unless_busy(self) -> Iterator[bool]:
        """The control lock if it is free now (True), else nothing (False)."""
        acquired = self._lock.acquire(blocking=False)
        try:
            yield acquired
        finally:
            if acquired:
                self._lock.release()

    # ------------------------------------------------------------------ queries

    def serves(self, name: str) -> bool:
        return name in self.volumes

    def served(self) -> list[str]:
        return list(self.volumes)

    def stack_of(self, name: str) -> list[str]:
        """``name`` and every volume it maps or is mapped by, bottom-up."""
        return self.stacking.stack_of(name)

    def bottom_up(self) -> list[str]:
        return self.stacking.bottom_up()

    def reaching(self, devices: set[str]) -> list[Volume]:
        """Every served volume whose tables map one of ``devices``, or that is stacked on
        such a volume, by name. Takes no lock (a lease thread calls it)."""
        names = {
            name
            for name, volume in list(self.volumes.items())
            if device_names(volume.tables()) & devices
        }
        waiting = list(names)
        while waiting:
            for user in self.stacking.volume_users(waiting.pop()):
                if user not in names:
                    names.add(user)
                    waiting.append(user)
        return [self.volumes[name] for name in sorted(names) if name in self.volumes]

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
