"""The master key's check value in SQL: one row, so every node of a deployment can tell
whether it holds the same master key as the node that wrapped the stored keys."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from app.db.models import MasterKeyCheck


def recorded(sessions: sessionmaker[Session]) -> bytes | None:
    """The recorded check value; None on a database no node has started on since it had one."""
    with sessions() as session:
        return session.scalar(select(MasterKeyCheck.value))


def record(sessions: sessionmaker[Session], value: bytes) -> bytes:
    """Record ``value`` unless a value is recorded; returns the one recorded, which is
    another node's when two nodes start together on a fresh database."""
    try:
        with sessions() as session, session.begin():
            session.add(MasterKeyCheck(id=1, value=value))
    except IntegrityError:
        pass
    value_now = recorded(sessions)
    assert value_now is not None
    return value_now


def replace(session: Session, value: bytes) -> None:
    """Within a rotation's transaction: the check value of the key the rows are now under."""
    row = session.get(MasterKeyCheck, 1, with_for_update=True)
    if row is None:
        session.add(MasterKeyCheck(id=1, value=value))
    else:
        row.value = value
