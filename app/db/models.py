"""Metadata tables. Nothing here is touched on the I/O hot path.

Table text is stored with every key zeroed (``format_table(show_keys=False)``);
the keys live only in ``wrapped_keys``, AES-256-GCM under the master key with the
volume's uuid and line index as associated data, so a blob cannot be replayed
into another volume or line.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    ForeignKey,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false,
    true,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.db.base import Base, utcnow


def new_uuid() -> str:
    return str(uuid.uuid4())


class Device(Base):
    __tablename__ = "devices"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    model: Mapped[str | None] = mapped_column(String(64))
    store: Mapped[str] = mapped_column(String(8), default="file", server_default="file")
    pool: Mapped[str | None] = mapped_column(String(64), comment="Ceph pool of an rbd device")
    image: Mapped[str | None] = mapped_column(String(128), comment="RBD image of an rbd device")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Volume(Base):
    __tablename__ = "volumes"

    id: Mapped[int] = mapped_column(primary_key=True)
    uuid: Mapped[str] = mapped_column(String(36), unique=True, default=new_uuid)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    state: Mapped[str] = mapped_column(String(16), default="active")
    dispatch_mode: Mapped[str] = mapped_column(String(16), default="request")
    engine: Mapped[str] = mapped_column(String(64), default="software")
    elevator: Mapped[str] = mapped_column(String(16), default="none")
    queue_limits: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    plug_window_us: Mapped[int | None] = mapped_column(comment="NULL: the service default")
    max_read_size: Mapped[int | None] = mapped_column(
        comment="dm-crypt's split of reads, bytes; NULL: the service default"
    )
    max_write_size: Mapped[int | None] = mapped_column(
        comment="dm-crypt's split of writes, bytes; NULL: the service default"
    )
    nbd_export: Mapped[bool] = mapped_column(default=False, server_default=false())
    event_nr: Mapped[int] = mapped_column(default=0)
    owner_node: Mapped[str | None] = mapped_column(
        String(64), comment="the node holding the lease (a cluster); NULL: nobody"
    )
    lease_expires_at: Mapped[datetime | None] = mapped_column(
        comment="the database's clock; past it another node may take the volume"
    )
    lease_epoch: Mapped[int] = mapped_column(
        default=0, server_default="0", comment="incremented at every takeover"
    )
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    tables: Mapped[list[VolumeTable]] = relationship(
        back_populates="volume", lazy="raise", cascade="all, delete-orphan"
    )


class Node(Base):
    """A ``reqcrypt serve`` of a cluster: where to reach it and when it last proved alive."""

    __tablename__ = "nodes"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    url: Mapped[str] = mapped_column(String(512))
    heartbeat_at: Mapped[datetime] = mapped_column(comment="the database's clock")
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    ready: Mapped[bool] = mapped_column(
        default=True,
        server_default=true(),
        comment="written with each heartbeat; false: fenced or stopping, place nothing here",
    )


class MasterKeyCheck(Base):
    """Which master key the wrapped keys are under, as an HMAC of a fixed label under it
    (``keyfiles.key_check_value``), never the key: a node holding another key refuses to
    start instead of failing at its first takeover. One row, written by the first node."""

    __tablename__ = "master_key_check"
    __table_args__ = (CheckConstraint("id = 1", name="one_row"),)

    id: Mapped[int] = mapped_column(primary_key=True, default=1)
    value: Mapped[bytes] = mapped_column(LargeBinary(32))
    recorded_at: Mapped[datetime] = mapped_column(default=utcnow)


class VolumeTable(Base):
    """A loaded table: slot ``live`` or ``inactive``; ``version`` counts loads."""

    __tablename__ = "volume_tables"
    __table_args__ = (UniqueConstraint("volume_id", "slot"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    volume_id: Mapped[int] = mapped_column(ForeignKey("volumes.id", ondelete="CASCADE"))
    slot: Mapped[str] = mapped_column(String(16))
    version: Mapped[int] = mapped_column(default=1)
    text: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    volume: Mapped[Volume] = relationship(back_populates="tables", lazy="raise")
    keys: Mapped[list[WrappedKey]] = relationship(
        back_populates="table", lazy="raise", cascade="all, delete-orphan"
    )


class WrappedKey(Base):
    __tablename__ = "wrapped_keys"
    __table_args__ = (UniqueConstraint("table_id", "line_index"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    table_id: Mapped[int] = mapped_column(ForeignKey("volume_tables.id", ondelete="CASCADE"))
    line_index: Mapped[int]
    blob: Mapped[bytes] = mapped_column(LargeBinary)

    table: Mapped[VolumeTable] = relationship(back_populates="keys", lazy="raise")


class _CustomRow:
    """The columns of a row the API creates by name; its JSON body is named per table."""

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class EngineProfileRow(_CustomRow, Base):
    """A custom engine created through the API; presets live in code."""

    __tablename__ = "engine_profiles"

    profile: Mapped[dict[str, Any]] = mapped_column(JSON)


class DeviceModelRow(_CustomRow, Base):
    """A custom device model created through the API; presets live in code."""

    __tablename__ = "device_models"

    params: Mapped[dict[str, Any]] = mapped_column(JSON)


class BenchmarkRun(Base):
    __tablename__ = "benchmark_runs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_uuid)
    state: Mapped[str] = mapped_column(String(16), default="queued")
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    progress: Mapped[float] = mapped_column(default=0.0)
    results: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    machine: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
