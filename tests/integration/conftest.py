"""Shared integration fixtures: a real ``reqcrypt serve`` on a loopback port, and a
database (SQLite or the real PostgreSQL) for tests that restart the app in process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.database import copy_database
from tests.support.servers import Server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    running = Server(tmp_path / "data")
    running.start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path) -> str:
    if request.param == "sqlite":
        return copy_database(sqlite_template, tmp_path)
    url: str = request.getfixturevalue("migrated_postgres_url")
    return url
