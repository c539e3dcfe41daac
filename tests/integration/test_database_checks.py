"""``reqcrypt serve`` refuses a database it cannot run on in one line, before it binds a
port: a PostgreSQL database not in UTF8, one migrated by a newer reqcrypt."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text

from app.db import migrate
from app.db.session import make_engine
from tests.support.database import POSTGRES_ADMIN_DSN
from tests.support.ports import free_port
from tests.support.servers import serve_refused


@pytest.fixture
def sql_ascii_url() -> Iterator[str]:
    """A database as initdb makes it under the C locale."""
    name = f"reqcrypt_ascii_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"CREATE DATABASE \"{name}\" ENCODING 'SQL_ASCII' TEMPLATE template0")
    try:
        yield f"{POSTGRES_ADMIN_DSN.rsplit('/', 1)[0]}/{name}"
    finally:
        with psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.postgres
def test_serve_refuses_a_sql_ascii_database_in_one_line(sql_ascii_url: str, tmp_path: Path) -> None:
    name = sql_ascii_url.rsplit("/", 1)[1]
    assert serve_refused(tmp_path / "data", sql_ascii_url) == [
        f"reqcrypt: serve: database {name!r} has encoding SQL_ASCII; reqcrypt needs UTF8: create it "
        f"with CREATE DATABASE {name} ENCODING 'UTF8' TEMPLATE template0 "
        f"(or createdb -E UTF8 -T template0 {name})"
    ]


def test_serve_refuses_an_unreachable_postgresql_in_one_line(tmp_path: Path) -> None:
    url = f"postgresql://reqcrypt@127.0.0.1:{free_port()}/reqcrypt"
    [line] = serve_refused(tmp_path / "data", url)
    assert line.startswith("reqcrypt: serve: cannot connect to PostgreSQL at 127.0.0.1:")


def test_serve_refuses_a_database_migrated_by_a_newer_reqcrypt(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'reqcrypt.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = 'f00dfeedbeef'"))
    engine.dispose()
    assert serve_refused(tmp_path / "data", url) == [
        "reqcrypt: serve: the database is at migration f00dfeedbeef, which this reqcrypt does not "
        f"know (its newest is {migrate.head_revision(url)}): run the newer reqcrypt, or "
        "restore a backup taken before it migrated"
    ]
