"""A ``Control`` over a migrated SQLite database of its own, built as ``main`` builds it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from app.control import Control
from app.control.guard import Guard
from app.db.records import Records
from app.db.session import make_engine, make_sessionmaker
from tests.support.control import make_control as build_control
from tests.support.database import copy_database

MakeControl = Callable[..., Control]


@pytest.fixture
def sessions(tmp_path: Path, sqlite_template: Path) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(copy_database(sqlite_template, tmp_path))
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture
def make_control(sessions: sessionmaker[Session], tmp_path: Path) -> MakeControl:
    """A restored ``Control`` on the same database and devices at every call (a restart)."""

    def make(records: type[Records] = Records, guard: Guard | None = None) -> Control:
        return build_control(sessions, tmp_path / "devices", records=records, guard=guard)

    return make
