"""What the service needs of its database, checked before anything else touches it.

Each problem is refused with one line saying what is wrong and how to fix it, not a
traceback from deep in a driver: under ``SQL_ASCII`` psycopg hands back ``bytes``
for text and SQLAlchemy's own start-up query fails on them, so PostgreSQL is asked
through psycopg alone, with answers read either way.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from app.db.migrate import alembic_config

MIN_POSTGRES = 150000
"""PostgreSQL 15 (Debian 12's, the oldest the tests run on; compose ships 16)."""
MIN_SQLITE = (3, 35, 0)
"""SQLite 3.35: ``ALTER TABLE … DROP COLUMN`` and ``RETURNING``, which migrations and
queries may use (Python's ``sqlite3`` module is linked to the system's library)."""


class DatabaseRefused(Exception):
    """The database cannot be used as it is; the message says why and what to do."""


def _text(value: Any) -> str:
    return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)


def postgres_problem(encoding: str, version_num: int, database: str) -> str | None:
    """Why a PostgreSQL database with this encoding and ``server_version_num`` is refused."""
    if encoding != "UTF8":
        return (
            f"database {database!r} has encoding {encoding}; reqcrypt needs UTF8: create it "
            f"with CREATE DATABASE {database} ENCODING 'UTF8' TEMPLATE template0 "
            f"(or createdb -E UTF8 -T template0 {database})"
        )
    if version_num < MIN_POSTGRES:
        major = version_num // 10000
        return f"PostgreSQL {major} is too old: reqcrypt needs {MIN_POSTGRES // 10000} or newer"
    return None


def sqlite_problem(version: tuple[int, int, int]) -> str | None:
    if version < MIN_SQLITE:
        shown = ".".join(map(str, version))
        needed = ".".join(map(str, MIN_SQLITE))
        return f"SQLite {shown} is too old: reqcrypt needs {needed} or newer"
    return None


def check_server(url: str) -> None:
    """Refuse (``DatabaseRefused``) a server or database reqcrypt cannot run on."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        problem = sqlite_problem(sqlite3.sqlite_version_info)
    else:
        import psycopg  # here: a SQLite service never loads the driver (~45 ms of start-up)

        dsn = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
        try:
            with psycopg.connect(dsn, connect_timeout=10) as connection:
                row = connection.execute(
                    "SELECT pg_encoding_to_char(encoding), "
                    "current_setting('server_version_num')::int, current_database() "
                    "FROM pg_database WHERE datname = current_database()"
                ).fetchone()
        except psycopg.OperationalError as error:
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else "no reason"
            raise DatabaseRefused(
                f"cannot connect to PostgreSQL at {parsed.host}:{parsed.port or 5432}: {first_line}"
            ) from None
        assert row is not None
        problem = postgres_problem(_text(row[0]), row[1], _text(row[2]))
    if problem is not None:
        raise DatabaseRefused(problem)


def check_revision(engine: Engine, url: str) -> None:
    """Refuse a database migrated by a newer reqcrypt: this code does not know its schema."""
    with engine.connect() as connection:
        current = MigrationContext.configure(connection).get_current_revision()
    script = ScriptDirectory.from_config(alembic_config(url))
    if current is not None and current not in {r.revision for r in script.walk_revisions()}:
        raise DatabaseRefused(
            f"the database is at migration {current}, which this reqcrypt does not know "
            f"(its newest is {script.get_current_head()}): run the newer reqcrypt, or "
            "restore a backup taken before it migrated"
        )
