"""``Control`` asks its guard, and only its guard, whether it may serve and write."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from app.config import Settings
from app.control import Control
from app.control.guard import SingleNode
from app.db import migrate
from app.db.queries import SqlRegistryStore
from app.db.records import Records, RecordsTx
from app.db.session import make_engine, make_sessionmaker
from app.dm.volume import Volume
from app.engine.registry import EngineRegistry
from app.errors import LeaseExpired, ReqcryptError, ServedElsewhere
from app.storage.registry import DeviceRegistry


class Refusing(SingleNode):
    """A guard that has lost every volume, and names another node for any lower volume."""

    refuse = False

    def check(self, records: RecordsTx, volume: Volume) -> None:
        if self.refuse:
            raise LeaseExpired(f"this node no longer holds the lease on volume {volume.name}")

    def own_new(self, records: RecordsTx, volume: Volume, started: float) -> Callable[[], None]:
        return lambda: None

    def not_served(self, name: str) -> ReqcryptError:
        return ServedElsewhere(f"volume {name} is served by node b")


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path / 'guard.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    yield engine
    engine.dispose()


def control_over(db: Engine, data_dir: Path, guard: SingleNode) -> Control:
    sessions = make_sessionmaker(db)
    control = Control(
        Records(sessions, bytes(32)),
        DeviceRegistry(data_dir / "devices"),
        EngineRegistry(SqlRegistryStore(sessions)),
        Settings(plug_window_us=0, suspend_wait_seconds=0.05).control,
        guard,
    )
    control.restore()
    return control


def test_a_write_the_guard_refuses_changes_neither_sql_nor_memory(
    db: Engine, tmp_path: Path
) -> None:
    guard = Refusing()
    control = control_over(db, tmp_path, guard)
    control.create_volume("v", "0 8 zero")
    guard.refuse = True
    with pytest.raises(LeaseExpired):
        control.suspend("v", noflush=False)
    assert control.volume("v").state == "active"
    control.close()
    assert control_over(db, tmp_path, SingleNode()).volume("v").state == "active"


def test_a_table_mapping_a_volume_not_served_here_is_told_why_by_the_guard(
    db: Engine, tmp_path: Path
) -> None:
    control = control_over(db, tmp_path, Refusing())
    with pytest.raises(ServedElsewhere, match="served by node b"):
        control.create_volume("upper", "0 8 linear /dev/mapper/lower 0")
