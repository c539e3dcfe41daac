"""``reqcrypt serve`` refuses a database it cannot run on in one line, before it binds a
port: a PostgreSQL database not in UTF8, one migrated by a newer reqcrypt."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text

from app.db import migrate
from app.db.session import make_engine
from tests.conftest import ADMIN_TOKEN, POSTGRES_ADMIN_DSN
from tests.integration.test_deployment import free_port

REQCRYPT = str(Path(sys.executable).with_name("reqcrypt"))


def serve(data_dir: Path, database_url: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "REQCRYPT_DATA_DIR": str(data_dir),
        "REQCRYPT_DATABASE_URL": database_url,
        "REQCRYPT_ADMIN_TOKEN": ADMIN_TOKEN,
        "REQCRYPT_PORT": str(free_port()),
    }
    return subprocess.run(
        [REQCRYPT, "serve"], env=env, capture_output=True, text=True, timeout=60, check=False
    )


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
    done = serve(tmp_path / "data", sql_ascii_url)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"reqcrypt: database {name!r} has encoding SQL_ASCII; reqcrypt needs UTF8: create it "
        f"with CREATE DATABASE {name} ENCODING 'UTF8' TEMPLATE template0 "
        f"(or createdb -E UTF8 -T template0 {name})"
    ]
    assert "Uvicorn running" not in done.stdout + done.stderr


def test_serve_refuses_an_unreachable_postgresql_in_one_line(tmp_path: Path) -> None:
    url = f"postgresql://reqcrypt@127.0.0.1:{free_port()}/reqcrypt"
    done = serve(tmp_path / "data", url)
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("reqcrypt: cannot connect to PostgreSQL at 127.0.0.1:")


def test_serve_refuses_a_database_migrated_by_a_newer_reqcrypt(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'reqcrypt.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = 'f00dfeedbeef'"))
    engine.dispose()
    done = serve(tmp_path / "data", url)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "reqcrypt: the database is at migration f00dfeedbeef, which this reqcrypt does not "
        f"know (its newest is {migrate.head_revision(url)}): run the newer reqcrypt, or "
        "restore a backup taken before it migrated"
    ]
