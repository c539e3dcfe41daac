"""Engine and session factory. Callers own their transactions (``with sessions.begin()``)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker


def _create_private_sqlite_file(url: str) -> None:
    """Create a SQLite database file 0600 before SQLite would (0644 less the umask), in a
    directory made 0700 if missing. SQLite gives the -wal, -shm and -journal files it makes
    beside the database the database file's mode, so they are private from their creation."""
    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        _create_private_sqlite_file(url)
        engine = create_engine(url, connect_args={"check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record):  # type: ignore[no-untyped-def]
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA busy_timeout=5000")
            cursor.close()

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    # A database that stops answering (a partition, a black hole) fails a statement within
    # seconds instead of the kernel's retransmission quarter of an hour: the lease thread
    # must get its error while the local deadline still matters.
    return create_engine(url, pool_pre_ping=True, connect_args=POSTGRES_TIMEOUTS)


POSTGRES_TIMEOUTS = {
    "connect_timeout": 5,
    "tcp_user_timeout": 5000,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 1,
    "keepalives_count": 3,
}
"""libpq's limits on a connection that stops answering (seconds; tcp_user_timeout in ms)."""


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False)
