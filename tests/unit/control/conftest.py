"""A ``Control`` over a migrated SQLite database of its own, built as ``main`` builds it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from app.config import Settings
from app.control import Control
from app.control.guard import Guard
from app.db import migrate
from app.db.queries import SqlRegistryStore
from app.db.records import Records
from app.db.session import make_engine, make_sessionmaker
from app.engine.registry import EngineRegistry
from app.storage.registry import DeviceRegistry

MASTER = bytes(32)
MakeControl = Callable[..., Control]


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    url = f"sqlite:///{tmp_path / 'control.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture
def make_control(sessions: sessionmaker[Session], tmp_path: Path) -> MakeControl:
    """A restored ``Control`` on the same database and devices at every call (a restart)."""

    def make(records: type[Records] = Records, guard: Guard | None = None) -> Control:
        control = Control(
            records(sessions, MASTER),
            DeviceRegistry(tmp_path / "devices"),
            EngineRegistry(SqlRegistryStore(sessions)),
            Settings(plug_window_us=0, suspend_wait_seconds=0.05).control,
            guard,
        )
        control.restore()
        return control

    return make
