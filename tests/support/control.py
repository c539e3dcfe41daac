"""A ``Control`` built in process as ``main`` builds it, over a database the test made."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from app.config import ControlSettings, Settings
from app.control import Control
from app.control.guard import Guard
from app.db.queries import SqlRegistryStore
from app.db.records import Records
from app.engine.registry import EngineRegistry
from app.storage.registry import DeviceRegistry

MASTER = bytes(32)
"""The master key the stored table keys are wrapped under."""


def make_control(
    sessions: sessionmaker[Session],
    devices: Path | DeviceRegistry,
    *,
    records: type[Records] = Records,
    guard: Guard | None = None,
    settings: ControlSettings | None = None,
) -> Control:
    """A ``Control`` restored from ``sessions`` (a restart when the database holds volumes),
    with devices in ``devices``; no plug window and a short suspend wait unless
    ``settings`` says otherwise."""
    registry = devices if isinstance(devices, DeviceRegistry) else DeviceRegistry(devices)
    control = Control(
        records(sessions, MASTER),
        registry,
        EngineRegistry(SqlRegistryStore(sessions)),
        settings or Settings(plug_window_us=0, suspend_wait_seconds=0.05).control,
        guard,
    )
    control.restore()
    return control
