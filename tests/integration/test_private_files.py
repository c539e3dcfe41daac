"""What the service writes is not readable by other local users: the data directory and
its devices directory 0700, the SQLite database and the -wal, -shm and -journal files
SQLite makes beside it 0600, under a permissive umask, from their creation."""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.db.session import make_engine
from app.keyfiles import data_dir_lock, make_data_dir
from tests.support.app import make_settings, started

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def permissive_umask() -> Iterator[None]:
    """0022, the usual default: what is private must not rely on the operator's umask."""
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_a_fresh_data_dir_is_0700_and_its_sqlite_files_0600(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    async with started(make_settings(data_dir)):
        assert mode(data_dir) == 0o700
        assert mode(data_dir / "devices") == 0o700
        for name in ("reqcrypt.db", "reqcrypt.db-wal", "reqcrypt.db-shm"):
            assert mode(data_dir / name) == 0o600, name


async def test_an_existing_data_dir_of_ours_is_tightened_at_start(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    (data_dir / "devices").mkdir(parents=True, mode=0o755)
    data_dir.chmod(0o755)
    async with started(make_settings(data_dir)):
        assert mode(data_dir) == 0o700
        assert mode(data_dir / "devices") == 0o700


def test_the_lock_serve_takes_makes_the_data_dir_private(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data")
    with data_dir_lock(settings, exclusive=False):
        assert mode(settings.data_dir) == 0o700
        assert mode(settings.devices_dir) == 0o700
        assert mode(settings.data_dir / "reqcrypt.lock") == 0o600


def test_a_shared_sticky_directory_keeps_its_mode(tmp_path: Path) -> None:
    """A data directory pointed at a shared directory (``/tmp``) is not taken from its users."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    make_data_dir(make_settings(shared))
    assert mode(shared) == 0o1777
    assert mode(shared / "devices") == 0o700


def test_the_engine_creates_the_database_0600_and_sqlite_its_side_files_alike(
    tmp_path: Path,
) -> None:
    path = tmp_path / "new" / "reqcrypt.db"
    engine = make_engine(f"sqlite:///{path}")
    try:
        assert mode(path.parent) == 0o700
        assert mode(path) == 0o600
        with engine.connect() as connection:
            connection.exec_driver_sql("CREATE TABLE t (x)")
            assert mode(path.with_name("reqcrypt.db-wal")) == 0o600
            assert mode(path.with_name("reqcrypt.db-shm")) == 0o600
    finally:
        engine.dispose()
    rollback = sqlite3.connect(path, isolation_level=None)
    try:
        rollback.execute("PRAGMA journal_mode=DELETE")
        rollback.execute("BEGIN")
        rollback.execute("INSERT INTO t VALUES (randomblob(65536))")
        assert mode(path.with_name("reqcrypt.db-journal")) == 0o600
        rollback.execute("COMMIT")
    finally:
        rollback.close()
