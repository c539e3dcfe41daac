"""The control plane's SQL: device and volume rows, table slots, wrapped keys.

``Records.transaction()`` opens one transaction and yields a ``RecordsTx`` whose
methods read and write rows; leaving the block commits (or rolls back on an
exception). The control plane calls it first and changes memory only after
the commit (ADR 0003), so nothing here touches a live ``Volume``.

Table text is stored with every key zeroed; each key is wrapped under the
master key with the volume uuid, table row id and line index as associated
data, and a wiped key is stored as zeros without a blob.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Literal

from sqlalchemy import ColumnElement, delete, select
from sqlalchemy.orm import Session, sessionmaker

from app.blk.limits import QueueLimits
from app.blk.tuning import Tuning
from app.crypto.keys import KeyUnwrapError, unwrap_key, wrap_key
from app.db import keycheck, leases, models
from app.dm.table import CryptParams, Table, format_table, parse_table
from app.vocab import StoreKind, VolumeState

Slot = Literal["live", "inactive"]


@dataclass(frozen=True, slots=True)
class StoredDevice:
    name: str
    size_bytes: int
    model: str | None
    store: StoreKind = "file"
    pool: str | None = None
    image: str | None = None


@dataclass(frozen=True, slots=True)
class StoredVolume:
    """A volume as recorded, keys unwrapped: what restore rebuilds."""

    name: str
    uuid: str
    state: VolumeState
    engine: str
    tuning: Tuning
    event_nr: int
    live: Table | None
    inactive: Table | None
    nbd_export: bool = False


def _key_aad(volume_uuid: str, table_id: int, line_index: int) -> bytes:
    return f"reqcrypt/v1/{volume_uuid}/{table_id}/{line_index}".encode()


def _write_tuning(row: models.Volume, tuning: Tuning) -> None:
    row.dispatch_mode = tuning.dispatch_mode
    row.elevator = tuning.elevator
    row.queue_limits = asdict(tuning.limits)
    row.plug_window_us = tuning.plug_window_us
    row.max_read_size = tuning.max_read_size
    row.max_write_size = tuning.max_write_size


def _read_tuning(row: models.Volume) -> Tuning:
    return Tuning(
        dispatch_mode=row.dispatch_mode,  # type: ignore[arg-type]
        elevator=row.elevator,  # type: ignore[arg-type]
        limits=QueueLimits(**row.queue_limits),
        plug_window_us=row.plug_window_us,
        max_read_size=row.max_read_size,
        max_write_size=row.max_write_size,
    )


def _wrapped_keys(session: Session) -> list[tuple[models.WrappedKey, bytes]]:
    """Every wrapped key row with its associated data (volume uuid, table row, line)."""
    rows = session.execute(
        select(models.WrappedKey, models.VolumeTable.id, models.Volume.uuid)
        .join(models.VolumeTable, models.WrappedKey.table_id == models.VolumeTable.id)
        .join(models.Volume, models.VolumeTable.volume_id == models.Volume.id)
        .order_by(models.WrappedKey.id)
    ).all()
    return [(key, _key_aad(uuid, table_id, key.line_index)) for key, table_id, uuid in rows]


def master_key_unwraps(sessions: sessionmaker[Session], master_key: bytes) -> bool | None:
    """Whether ``master_key`` opens every stored key (None: no key is stored)."""
    with sessions() as session:
        rows = _wrapped_keys(session)
    if not rows:
        return None
    for row, aad in rows:
        try:
            unwrap_key(master_key, row.blob, aad).wipe()
        except KeyUnwrapError:
            return False
    return True


def rewrap_keys(
    sessions: sessionmaker[Session], old_key: bytes, new_key: bytes, check_value: bytes
) -> int:
    """Re-wrap every stored key from ``old_key`` to ``new_key`` in one transaction, which
    also records ``check_value`` (the new key's) for the nodes that start next.

    The rows are locked (``FOR UPDATE`` where the database has it) so no writer can
    commit a key wrapped under the old key in between. Returns how many were re-wrapped.
    """
    with sessions() as session, session.begin():
        session.execute(select(models.WrappedKey.id).with_for_update()).all()
        rows = _wrapped_keys(session)
        for row, aad in rows:
            key = unwrap_key(old_key, row.blob, aad)
            try:
                row.blob = wrap_key(new_key, key, aad)
            finally:
                key.wipe()
        keycheck.replace(session, check_value)
        return len(rows)


class Records:
    def __init__(self, sessions: sessionmaker[Session], master_key: bytes) -> None:
        self.sessions = sessions
        self.master_key = master_key

    @contextmanager
    def transaction(self) -> Iterator[RecordsTx]:
        with self.sessions() as session, session.begin():
            yield RecordsTx(session, self.master_key)


class RecordsTx:
    """Row operations inside one transaction; each at most flushes."""

    def __init__(self, session: Session, master_key: bytes) -> None:
        self.session = session
        self.master_key = master_key

    # ------------------------------------------------------------------ devices

    def add_device(self, device: StoredDevice) -> None:
        self.session.add(models.Device(**asdict(device)))
        self.session.flush()

    def delete_device(self, name: str) -> None:
        self.session.execute(delete(models.Device).where(models.Device.name == name))

    def devices(self) -> list[StoredDevice]:
        return [
            StoredDevice(
                row.name,
                row.size_bytes,
                row.model,
                "rbd" if row.store == "rbd" else "file",
                row.pool,
                row.image,
            )
            for row in self.session.scalars(select(models.Device))
        ]

    # ------------------------------------------------------------------ volumes

    def add_volume(
        self,
        name: str,
        uuid: str,
        *,
        engine: str,
        tuning: Tuning,
        live: Table,
        nbd_export: bool = False,
    ) -> None:
        row = models.Volume(
            uuid=uuid, name=name, state="active", engine=engine, event_nr=1, nbd_export=nbd_export
        )
        _write_tuning(row, tuning)
        self.session.add(row)
        self.session.flush()
        self._store_table(row, "live", live, 1)

    def load_inactive(self, name: str, table: Table) -> None:
        """The new inactive table's version follows both the old inactive and the live one."""
        row = self._volume_row(name)
        version = 1
        old = self._slot_row(row, "inactive")
        if old is not None:
            version = old.version + 1
            self.session.delete(old)
            self.session.flush()
        live = self._slot_row(row, "live")
        if live is not None:
            version = max(version, live.version + 1)
        self._store_table(row, "inactive", table, version)

    def clear_inactive(self, name: str) -> None:
        row = self._volume_row(name)
        old = self._slot_row(row, "inactive")
        if old is not None:
            self.session.delete(old)

    def set_state(self, name: str, state: VolumeState, event_nr: int) -> None:
        row = self._volume_row(name)
        row.state = state
        row.event_nr = event_nr

    def promote_inactive(self, name: str) -> None:
        """resume with an inactive table: it replaces the live one."""
        row = self._volume_row(name)
        live = self._slot_row(row, "live")
        if live is not None:
            self.session.delete(live)
            self.session.flush()
        inactive = self._slot_row(row, "inactive")
        assert inactive is not None
        inactive.slot = "live"

    def replace_live(self, name: str, table: Table, event_nr: int) -> None:
        """A message changed the live table (a key set or wiped): same version, new keys."""
        row = self._volume_row(name)
        live = self._slot_row(row, "live")
        version = live.version if live is not None else 1
        if live is not None:
            self.session.delete(live)
            self.session.flush()
        self._store_table(row, "live", table, version)
        row.event_nr = event_nr

    def rename_volume(self, name: str, new_name: str) -> None:
        self._volume_row(name).name = new_name

    def delete_volume(self, name: str) -> None:
        self.session.delete(self._volume_row(name))

    def retune(self, name: str, *, engine: str, tuning: Tuning) -> None:
        row = self._volume_row(name)
        row.engine = engine
        _write_tuning(row, tuning)

    def set_nbd_export(self, name: str, nbd_export: bool) -> None:
        self._volume_row(name).nbd_export = nbd_export

    def hold_lease(self, uuid: str, node: str, epoch: int) -> bool:
        return leases.hold(self.session, uuid, node, epoch)

    def own_new(self, uuid: str, node: str, lease_seconds: float) -> leases.Lease:
        self.session.flush()
        return leases.own_new(self.session, uuid, node, lease_seconds)

    def volume(self, uuid: str) -> StoredVolume:
        """One volume by uuid (a cluster node adopting it)."""
        (stored,) = self.volumes(models.Volume.uuid == uuid)
        return stored

    def volumes(self, *where: ColumnElement[bool]) -> list[StoredVolume]:
        rows = list(self.session.scalars(select(models.Volume).where(*where)))
        ids = [row.id for row in rows]
        tables = {
            (t.volume_id, t.slot): t
            for t in self.session.scalars(
                select(models.VolumeTable).where(models.VolumeTable.volume_id.in_(ids))
            )
        }
        keys: dict[tuple[int, int], bytes] = {
            (k.table_id, k.line_index): k.blob
            for k in self.session.scalars(
                select(models.WrappedKey).where(
                    models.WrappedKey.table_id.in_([t.id for t in tables.values()])
                )
            )
        }

        def stored(row: models.Volume, slot: Slot) -> Table | None:
            table_row = tables.get((row.id, slot))
            return None if table_row is None else self._unwrap(row, table_row, keys)

        return [
            StoredVolume(
                name=row.name,
                uuid=row.uuid,
                state=row.state,  # type: ignore[arg-type]
                engine=row.engine,
                tuning=_read_tuning(row),
                event_nr=row.event_nr,
                live=stored(row, "live"),
                inactive=stored(row, "inactive"),
                nbd_export=row.nbd_export,
            )
            for row in rows
        ]

    # ------------------------------------------------------------------ rows

    def _volume_row(self, name: str) -> models.Volume:
        return self.session.scalars(select(models.Volume).where(models.Volume.name == name)).one()

    def _slot_row(self, row: models.Volume, slot: Slot) -> models.VolumeTable | None:
        return self.session.scalars(
            select(models.VolumeTable).where(
                models.VolumeTable.volume_id == row.id, models.VolumeTable.slot == slot
            )
        ).one_or_none()

    def _store_table(self, row: models.Volume, slot: Slot, table: Table, version: int) -> None:
        table_row = models.VolumeTable(
            volume_id=row.id, slot=slot, version=version, text=format_table(table)
        )
        self.session.add(table_row)
        self.session.flush()
        for index, line in enumerate(table.lines):
            if isinstance(line.target, CryptParams) and line.target.key is not None:
                blob = wrap_key(
                    self.master_key, line.target.key, _key_aad(row.uuid, table_row.id, index)
                )
                self.session.add(
                    models.WrappedKey(table_id=table_row.id, line_index=index, blob=blob)
                )

    def _unwrap(
        self,
        row: models.Volume,
        table_row: models.VolumeTable,
        keys: dict[tuple[int, int], bytes],
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
                key = unwrap_key(self.master_key, blob, _key_aad(row.uuid, table_row.id, index))
                lines[index] = replace(line, target=replace(params, key=key))
        return Table(tuple(lines))
