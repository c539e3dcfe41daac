"""Databases for tests: SQLite copied from one migrated template, PostgreSQL made fresh."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from app.db import migrate

POSTGRES_ADMIN_DSN = os.environ.get(
    "REQCRYPT_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"
)
SQLITE_NAME = "reqcrypt.db"
"""The file name ``Settings`` gives the SQLite database in its data directory."""


def migrated_template(directory: Path) -> Path:
    """A SQLite database migrated to head in ``directory``: the original every test copies,
    so a session migrates once instead of once per test."""
    path = directory / SQLITE_NAME
    migrate.upgrade(f"sqlite:///{path}")
    return path


def copy_database(template: Path, directory: Path) -> str:
    """A copy of ``template`` in ``directory`` (the test's own, isolated); its URL."""
    path = directory / SQLITE_NAME
    shutil.copyfile(template, path)
    return f"sqlite:///{path}"


@contextmanager
def fresh_postgres_database(template: str | None = None) -> Iterator[str]:
    """A new database on the real PostgreSQL, dropped afterwards (its URL): empty, or a
    copy of database ``template`` (which no connection may be using)."""
    name = f"reqcrypt_{uuid.uuid4().hex[:12]}"
    copy = f' TEMPLATE "{template}"' if template else ""
    with psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"{copy}')
    base = POSTGRES_ADMIN_DSN.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def migrated_postgres_template() -> Iterator[str]:
    """A database migrated to head on the real PostgreSQL, for ``fresh_postgres_database``
    to copy (its name); dropped afterwards."""
    with fresh_postgres_database() as url:
        migrate.upgrade(url)
        yield url.rsplit("/", 1)[1]
