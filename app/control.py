"""The control plane: devices and volumes, persisted in SQL and mirrored in memory.

Every lifecycle call runs under one lock (per process), validates, writes SQL in
its own transaction, commits, and only then applies the change to the in-memory
volume, whose own steps are validated beforehand and cannot fail half-way. So no
interleaving and no failed commit can leave SQL and memory disagreeing. The data
path never comes here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from app.blk.limits import QueueLimits
from app.crypto.keys import unwrap_key, wrap_key
from app.db import models
from app.dm.table import (
    CryptParams,
    DeviceRef,
    ErrorParams,
    Table,
    TableLine,
    format_table,
    parse_table,
)
from app.dm.targets import BlockDevice
from app.dm.timed import TimedDevice
from app.dm.volume import Volume
from app.engine.base import Engine
from app.engine.registry import EngineRegistry
from app.errors import (
    AlreadyExists,
    DeviceBusy,
    DeviceNotFound,
    InvalidInput,
    InvalidState,
    VolumeBusy,
    VolumeNotFound,
)
from app.storage.registry import DeviceRegistry
from app.vocab import SECTOR_SIZE, DispatchMode, ElevatorName, is_valid_name


def check_name(kind: str, name: str) -> None:
    if not is_valid_name(name):
        raise InvalidInput(
            f"{kind} name must be 1-64 characters of letters, digits, '.', '_' or '-'"
        )


class Control:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        devices: DeviceRegistry,
        engines: EngineRegistry,
        master_key: bytes,
        *,
        plug_window_us: int,
        suspend_wait_seconds: float,
    ) -> None:
        self.sessions = sessions
        self.devices = devices
        self.engines = engines
        self.master_key = master_key
        self.plug_window_us = plug_window_us
        self.suspend_wait_seconds = suspend_wait_seconds
        self.volumes: dict[str, Volume] = {}
        self.device_sizes: dict[str, int] = {}
        self.device_models: dict[str, str | None] = {}
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ plumbing

    @contextmanager
    def _transaction(self) -> Iterator[Session]:
        with self.sessions() as session, session.begin():
            yield session

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
        return self.volume(ref.name).size // SECTOR_SIZE

    def resolve(self, ref: DeviceRef) -> BlockDevice:
        """The object a table line maps onto; modelled devices accrue virtual time."""
        if ref.kind == "device":
            store = self.devices.get(ref.name)
            model = self.device_models.get(ref.name)
            if model is None:
                return store
            return TimedDevice(store, self.engines.device_timer(model))
        return self.volume(ref.name)

    def _key_aad(self, volume_uuid: str, table_id: int, line_index: int) -> bytes:
        return f"reqcrypt/v1/{volume_uuid}/{table_id}/{line_index}".encode()

    def _tables_of(self, volume: Volume) -> list[Table]:
        tables = [volume.live.table] if volume.live else []
        return tables + ([volume.inactive] if volume.inactive else [])

    def users_of(self, key: str) -> list[str]:
        """Volumes whose live or inactive table maps ``key`` (``DeviceRef.key``)."""
        return sorted(
            name
            for name, volume in self.volumes.items()
            if any(key in table.devices() for table in self._tables_of(volume))
        )

    def _check_no_cycle(self, name: str, table: Table) -> None:
        seen: set[str] = set()
        pending = list(table.volume_names())
        while pending:
            current = pending.pop()
            if current == name:
                raise InvalidInput(f"table would make volume {name} map onto itself")
            if current in seen:
                continue
            seen.add(current)
            other = self.volumes.get(current)
            if other is not None:
                for other_table in self._tables_of(other):
                    pending.extend(other_table.volume_names())

    # ------------------------------------------------------------------ devices

    def create_device(self, name: str, size_bytes: int, model: str | None) -> None:
        check_name("device", name)
        if size_bytes <= 0 or size_bytes % SECTOR_SIZE:
            raise InvalidInput("size_bytes must be a positive multiple of 512")
        if model is not None:
            self.engines.device_model(model)
        with self._lock:
            if name in self.device_sizes:
                raise AlreadyExists(f"device {name} exists")
            try:
                with self._transaction() as session:
                    session.add(models.Device(name=name, size_bytes=size_bytes, model=model))
                    session.flush()
                    self.devices.create(name, size_bytes)
            except BaseException:
                self.devices.remove(name)  # no row refers to the file: drop it
                raise
            self.device_sizes[name] = size_bytes
            self.device_models[name] = model

    def delete_device(self, name: str) -> None:
        with self._lock:
            if name not in self.device_sizes:
                raise DeviceNotFound(f"device {name} not found")
            users = self.users_of(name)
            if users:
                raise DeviceBusy(f"device {name} is mapped by volume(s) {', '.join(users)}")
            with self._transaction() as session:
                session.execute(delete(models.Device).where(models.Device.name == name))
            self.devices.remove(name)
            del self.device_sizes[name]
            del self.device_models[name]

    def device_info(self, name: str) -> dict[str, Any]:
        if name not in self.device_sizes:
            raise DeviceNotFound(f"device {name} not found")
        return {
            "name": name,
            "size_bytes": self.device_sizes[name],
            "allocated_bytes": self.devices.get(name).allocated_bytes(),
            "model": self.device_models[name],
            "mapped_by": self.users_of(name),
        }

    # ------------------------------------------------------------------ volumes

    def _parse(self, name: str, text: str, engine: Engine) -> Table:
        table = parse_table(text, resolve=self)
        self._check_no_cycle(name, table)
        check_engine(engine, table)
        return table

    def _store_table(
        self, session: Session, row: models.Volume, slot: str, table: Table, version: int
    ) -> models.VolumeTable:
        table_row = models.VolumeTable(
            volume_id=row.id, slot=slot, version=version, text=format_table(table)
        )
        session.add(table_row)
        session.flush()
        for index, line in enumerate(table.lines):
            if isinstance(line.target, CryptParams) and line.target.key is not None:
                blob = wrap_key(
                    self.master_key,
                    line.target.key,
                    self._key_aad(row.uuid, table_row.id, index),
                )
                session.add(models.WrappedKey(table_id=table_row.id, line_index=index, blob=blob))
        return table_row

    def _volume_row(self, session: Session, name: str) -> models.Volume:
        return session.scalars(select(models.Volume).where(models.Volume.name == name)).one()

    def _slot_row(
        self, session: Session, row: models.Volume, slot: str
    ) -> models.VolumeTable | None:
        return session.scalars(
            select(models.VolumeTable).where(
                models.VolumeTable.volume_id == row.id, models.VolumeTable.slot == slot
            )
        ).one_or_none()

    def create_volume(
        self,
        name: str,
        table_text: str,
        *,
        dispatch_mode: DispatchMode = "request",
        engine: str = "software",
        limits: QueueLimits | None = None,
        elevator: ElevatorName = "none",
        plug_window_us: int | None = None,
        nbd_export: bool = False,
    ) -> Volume:
        """dmsetup create: load + resume. ``plug_window_us`` None: the service default."""
        check_name("volume", name)
        limits = limits or QueueLimits()
        limits.validate()
        engine_obj = self.engines.engine(engine)
        with self._lock:
            if name in self.volumes:
                raise AlreadyExists(f"volume {name} exists")
            table = self._parse(name, table_text, engine_obj)
            volume = Volume(
                name,
                models.new_uuid(),
                engine=engine_obj,
                limits=limits,
                dispatch_mode=dispatch_mode,
                elevator=elevator,
                plug_window_us=self.plug_window_us if plug_window_us is None else plug_window_us,
                suspend_wait_seconds=self.suspend_wait_seconds,
            )
            volume.nbd_export = nbd_export
            volume.load(table)
            volume.check_resumable()
            with self._transaction() as session:
                row = models.Volume(
                    uuid=volume.uuid,
                    name=name,
                    state="active",
                    dispatch_mode=dispatch_mode,
                    engine=engine,
                    elevator=elevator,
                    queue_limits=asdict(limits),
                    plug_window_us=plug_window_us,
                    nbd_export=nbd_export,
                    event_nr=1,
                )
                session.add(row)
                session.flush()
                self._store_table(session, row, "live", table, 1)
                volume.resume(self.resolve)
            self._open_devices(table, +1)
            self.volumes[name] = volume
            return volume

    def _open_devices(self, table: Table | None, delta: int) -> None:
        if table is None:
            return
        for volume_name in table.volume_names():
            other = self.volumes.get(volume_name)
            if other is not None:
                other.open_count += delta

    def load_table(self, name: str, table_text: str) -> None:
        with self._lock:
            volume = self.volume(name)
            table = self._parse(name, table_text, volume.engine)
            with self._transaction() as session:
                row = self._volume_row(session, name)
                old = self._slot_row(session, row, "inactive")
                version = 1
                if old is not None:
                    version = old.version + 1
                    session.delete(old)
                    session.flush()
                live = self._slot_row(session, row, "live")
                if live is not None:
                    version = max(version, live.version + 1)
                self._store_table(session, row, "inactive", table, version)
            volume.load(table)

    def clear_inactive(self, name: str) -> None:
        with self._lock:
            volume = self.volume(name)
            with self._transaction() as session:
                row = self._volume_row(session, name)
                old = self._slot_row(session, row, "inactive")
                if old is not None:
                    session.delete(old)
            volume.clear_inactive()

    def suspend(self, name: str, *, noflush: bool) -> None:
        with self._lock:
            volume = self.volume(name)
            with volume.lock:
                if volume.state == "suspended":
                    return
                with self._transaction() as session:
                    row = self._volume_row(session, name)
                    row.state = "suspended"
                    row.event_nr = volume.event_nr + 1
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
                with self._transaction() as session:
                    row = self._volume_row(session, name)
                    if new_table is not None:
                        live = self._slot_row(session, row, "live")
                        if live is not None:
                            session.delete(live)
                            session.flush()
                        inactive = self._slot_row(session, row, "inactive")
                        assert inactive is not None
                        inactive.slot = "live"
                    row.state = "active"
                    row.event_nr = volume.event_nr + 1
                replaced = volume.resume(self.resolve)
                if new_table is not None:
                    self._open_devices(replaced, -1)
                    self._open_devices(new_table, +1)

    def message(self, name: str, text: str, sector: int = 0) -> None:
        words = text.split()
        with self._lock:
            volume = self.volume(name)
            with volume.lock:
                index, table = volume.plan_message(words, sector)
                with self._transaction() as session:
                    row = self._volume_row(session, name)
                    live = self._slot_row(session, row, "live")
                    version = live.version if live is not None else 1
                    if live is not None:
                        session.delete(live)
                        session.flush()
                    self._store_table(session, row, "live", table, version)
                    row.event_nr = volume.event_nr + 1
                volume.apply_line(index, table, self.resolve)

    def rename(self, name: str, new_name: str) -> None:
        check_name("volume", new_name)
        with self._lock:
            volume = self.volume(name)
            if new_name in self.volumes:
                raise AlreadyExists(f"volume {new_name} exists")
            if volume.open_count:
                raise VolumeBusy(f"volume {name} is mapped by another volume; rename it later")
            with self._transaction() as session:
                self._volume_row(session, name).name = new_name
            volume.name = new_name
            self.volumes[new_name] = self.volumes.pop(name)

    def remove(self, name: str, *, force: bool = False) -> None:
        with self._lock:
            volume = self.volume(name)
            users = self.users_of(f"/dev/mapper/{name}")
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
            with self._transaction() as session:
                session.delete(self._volume_row(session, name))
            self._open_devices(volume.live.table if volume.live else None, -1)
            volume.remove()
            del self.volumes[name]

    def retune(
        self,
        name: str,
        *,
        dispatch_mode: DispatchMode | None = None,
        engine: str | None = None,
        limits: QueueLimits | None = None,
        elevator: ElevatorName | None = None,
        plug_window_us: int | None = None,
        nbd_export: bool | None = None,
    ) -> None:
        if limits is not None:
            limits.validate()
        engine_obj = self.engines.engine(engine) if engine is not None else None
        with self._lock:
            volume = self.volume(name)
            if engine_obj is not None:
                for table in self._tables_of(volume):
                    check_engine(engine_obj, table)
            with self._transaction() as session:
                row = self._volume_row(session, name)
                if dispatch_mode is not None:
                    row.dispatch_mode = dispatch_mode
                if engine is not None:
                    row.engine = engine
                if limits is not None:
                    row.queue_limits = asdict(limits)
                if elevator is not None:
                    row.elevator = elevator
                if plug_window_us is not None:
                    row.plug_window_us = plug_window_us
                if nbd_export is not None:
                    row.nbd_export = nbd_export
            volume.retune(
                dispatch_mode=dispatch_mode,
                engine=engine_obj,
                limits=limits,
                elevator=elevator,
                plug_window_us=plug_window_us,
            )
            if nbd_export is not None:
                volume.nbd_export = nbd_export

    # ------------------------------------------------------------------ restart

    def restore(self) -> None:
        """Rebuild devices and volumes from SQL, stacked volumes after what they map."""
        with self._transaction() as session:
            for device in session.scalars(select(models.Device)):
                self.devices.open(device.name, device.size_bytes)
                self.device_sizes[device.name] = device.size_bytes
                self.device_models[device.name] = device.model
            rows = list(session.scalars(select(models.Volume)))
            tables = {(t.volume_id, t.slot): t for t in session.scalars(select(models.VolumeTable))}
            keys: dict[tuple[int, int], bytes] = {
                (k.table_id, k.line_index): k.blob
                for k in session.scalars(select(models.WrappedKey))
            }
        pending = {row.name: row for row in rows}
        while pending:
            progressed = False
            for name, row in list(pending.items()):
                live_row = tables.get((row.id, "live"))
                inactive_row = tables.get((row.id, "inactive"))
                needed = set()
                for table_row in (live_row, inactive_row):
                    if table_row is not None:
                        needed |= parse_table(table_row.text).volume_names()
                if needed - set(self.volumes):
                    continue
                self._restore_volume(row, live_row, inactive_row, keys)
                del pending[name]
                progressed = True
            if not progressed:
                raise InvalidState(
                    "cannot restore volumes mapping missing volumes: " + ", ".join(sorted(pending))
                )

    def _load_stored(
        self, row: models.Volume, table_row: models.VolumeTable, keys: dict[tuple[int, int], bytes]
    ) -> Table:
        table = parse_table(table_row.text)
        lines = list(table.lines)
        for index, line in enumerate(lines):
            params = line.target
            if isinstance(params, CryptParams) and params.key is not None:
                blob = keys.get((table_row.id, index))
                if blob is None:  # stored wiped: zeros of the wiped key's length, no blob
                    wiped = replace(params, key=None, wiped_key_size=len(params.key))
                    lines[index] = replace(line, target=wiped)
                    continue
                key = unwrap_key(
                    self.master_key, blob, self._key_aad(row.uuid, table_row.id, index)
                )
                lines[index] = replace(line, target=replace(params, key=key))
        return Table(tuple(lines))

    def _restore_volume(
        self,
        row: models.Volume,
        live_row: models.VolumeTable | None,
        inactive_row: models.VolumeTable | None,
        keys: dict[tuple[int, int], bytes],
    ) -> None:
        volume = Volume(
            row.name,
            row.uuid,
            engine=self.engines.engine(row.engine),
            limits=QueueLimits(**row.queue_limits),
            dispatch_mode=row.dispatch_mode,  # type: ignore[arg-type]
            elevator=row.elevator,  # type: ignore[arg-type]
            plug_window_us=self.plug_window_us
            if row.plug_window_us is None
            else row.plug_window_us,
            suspend_wait_seconds=self.suspend_wait_seconds,
        )
        if live_row is not None:
            live = self._load_stored(row, live_row, keys)
            if row.state == "active":
                volume.load(live)
                volume.resume(self.resolve)
            else:
                volume.install_suspended(live, self.resolve)
            self._open_devices(live, +1)
        if inactive_row is not None:
            volume.load(self._load_stored(row, inactive_row, keys))
        volume.event_nr = row.event_nr
        volume.nbd_export = row.nbd_export
        self.volumes[row.name] = volume

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
