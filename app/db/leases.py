"""Volume leases and node heartbeats in the shared PostgreSQL: who owns which volume.

Every statement that gives a volume an owner is one conditional ``UPDATE … RETURNING``
whose ``WHERE`` says the lease is free (no owner, or expired), or already ours. Under
READ COMMITTED two nodes racing for one row serialize on its row lock, and the second
re-evaluates the ``WHERE`` against the first one's committed row: it no longer matches,
so exactly one wins. Every time is the database's ``now()`` (one clock for all nodes);
a node turns the answer into a local ``time.monotonic()`` deadline measured from
*before* it sent the statement, so it always believes its lease ends earlier than the
database does. ``lease_epoch`` grows at every takeover: a renewal or a lifecycle write
names the epoch it holds, so a node that lost the lease and got nothing back cannot
renew or write under a newer owner's epoch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, func, or_, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session, sessionmaker

from app.db.models import Node, Volume, VolumeTable


@dataclass(frozen=True, slots=True)
class Lease:
    uuid: str
    name: str
    epoch: int
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class Owner:
    """Who owns a volume by name, as the database says now."""

    uuid: str
    node: str | None
    url: str | None
    epoch: int
    expires_at: datetime | None
    live: bool
    """The lease has not expired."""
    remaining_seconds: float
    """Until the lease expires, on the database's clock (0 once expired)."""


@dataclass(frozen=True, slots=True)
class NodeLoad:
    node: str
    url: str
    volumes: int


def _lease(uuid: str, name: str, epoch: int, expires_at: datetime | None) -> Lease:
    assert expires_at is not None  # every statement that returns a lease has just set it
    return Lease(uuid, name, epoch, expires_at)


def _free_or_mine(node: str) -> object:
    return or_(
        Volume.owner_node.is_(None),
        Volume.owner_node == node,
        Volume.lease_expires_at.is_(None),
        Volume.lease_expires_at < func.now(),
    )


class Leases:
    """The lease statements of one node (``node``), each in its own transaction."""

    def __init__(self, sessions: sessionmaker[Session], node: str, lease_seconds: float) -> None:
        self.sessions = sessions
        self.node = node
        self.lease_seconds = lease_seconds
        self.span = timedelta(seconds=lease_seconds)
        self._idle_ms = max(250, int(lease_seconds * 250))

    @contextmanager
    def _writing(self) -> Iterator[Session]:
        """A transaction of lease writes that PostgreSQL aborts if this node falls silent in
        it: a renewal whose answer a partition swallowed would otherwise keep its row locked
        (and the next owner's ``take`` waiting) until the server noticed the dead peer."""
        with self.sessions() as session, session.begin():
            session.execute(
                text(f"SET LOCAL idle_in_transaction_session_timeout = {self._idle_ms}")
            )
            yield session

    def heartbeat(self, url: str, *, ready: bool = True) -> None:
        """Prove this node alive; ``ready`` False keeps placement away (Ceph client blocklisted, stopping)."""
        statement = insert(Node).values(
            id=self.node, url=url, heartbeat_at=func.now(), started_at=func.now(), ready=ready
        )
        statement = statement.on_conflict_do_update(
            index_elements=[Node.id],
            set_={"url": url, "heartbeat_at": func.now(), "ready": ready},
        )
        with self._writing() as session:
            session.execute(statement)

    def take(self, uuid: str) -> Lease | None:
        """Take the lease if it is free, expired, or handed to us; every take starts a new
        epoch (renewing is ``renew``)."""
        statement = (
            update(Volume)
            .where(Volume.uuid == uuid, _free_or_mine(self.node))  # type: ignore[arg-type]
            .values(
                owner_node=self.node,
                lease_expires_at=func.now() + self.span,
                lease_epoch=Volume.lease_epoch + 1,
            )
            .returning(Volume.uuid, Volume.name, Volume.lease_epoch, Volume.lease_expires_at)
        )
        with self._writing() as session:
            row = session.execute(statement).one_or_none()
        return None if row is None else _lease(*row)

    def renew(self, held: Mapping[str, int]) -> dict[str, Lease]:
        """Extend every lease of ``held`` (uuid: epoch) still ours and unexpired; the ones
        missing from the answer are lost."""
        if not held:
            return {}
        statement = (
            update(Volume)
            .where(
                Volume.uuid.in_(list(held)),
                Volume.owner_node == self.node,
                Volume.lease_expires_at >= func.now(),
            )
            .values(lease_expires_at=func.now() + self.span)
            .returning(Volume.uuid, Volume.name, Volume.lease_epoch, Volume.lease_expires_at)
        )
        with self._writing() as session:
            rows = session.execute(statement).all()
        return {
            uuid: _lease(uuid, name, epoch, expires)
            for uuid, name, epoch, expires in rows
            if held[uuid] == epoch
        }

    def release(self, uuid: str, epoch: int) -> None:
        """Give the lease up at once (a clean stop): another node may take it now."""
        statement = (
            update(Volume)
            .where(Volume.uuid == uuid, Volume.owner_node == self.node, Volume.lease_epoch == epoch)
            .values(owner_node=None, lease_expires_at=None)
        )
        with self._writing() as session:
            session.execute(statement)

    def hand_over(self, uuid: str, epoch: int, node: str) -> bool:
        """Give our unexpired lease to ``node`` with a full term; its ``take`` starts the
        next epoch."""
        statement = (
            update(Volume)
            .where(
                Volume.uuid == uuid,
                Volume.owner_node == self.node,
                Volume.lease_epoch == epoch,
                Volume.lease_expires_at >= func.now(),
            )
            .values(
                owner_node=node,
                lease_expires_at=func.now() + self.span,
            )
            .returning(Volume.uuid)
        )
        with self._writing() as session:
            return session.execute(statement).one_or_none() is not None

    def claimable(self) -> list[tuple[str, str, bool]]:
        """(uuid, name, handed to us) of every volume this node could take: free, expired,
        or already given to it (a move's target) — the caller skips what it holds."""
        handed = Volume.owner_node == self.node
        free = _free_or_mine(self.node)
        statement = select(Volume.uuid, Volume.name, handed).where(free)  # type: ignore[arg-type]
        with self.sessions() as session:
            return [(uuid, name, bool(mine)) for uuid, name, mine in session.execute(statement)]

    def tables_of(self, uuids: list[str]) -> dict[str, list[str]]:
        """uuid: the text of its live and inactive tables (keys zeroed, as stored), for
        the stacking order of a takeover; it needs no key unwrapped."""
        statement = (
            select(Volume.uuid, VolumeTable.text)
            .join(VolumeTable, VolumeTable.volume_id == Volume.id)
            .where(Volume.uuid.in_(uuids))
        )
        texts: dict[str, list[str]] = {uuid: [] for uuid in uuids}
        with self.sessions() as session:
            for uuid, text in session.execute(statement):
                texts[uuid].append(text)
        return texts

    def owner_of(self, name: str) -> Owner | None:
        """Who owns volume ``name`` now (None: no such volume): the one owner lookup."""
        owners = self._owners(Volume.name == name)
        return owners[0] if owners else None

    def owners(self) -> dict[str, Owner]:
        """uuid: the owner of every volume of the cluster, in one statement."""
        return {owner.uuid: owner for owner in self._owners()}

    def _owners(self, *where: ColumnElement[bool]) -> list[Owner]:
        statement = (
            select(
                Volume.uuid,
                Volume.owner_node,
                Node.url,
                Volume.lease_epoch,
                Volume.lease_expires_at,
                Volume.lease_expires_at >= func.now(),
                func.extract("epoch", Volume.lease_expires_at - func.now()),
            )
            .outerjoin(Node, Node.id == Volume.owner_node)
            .where(*where)
        )
        with self.sessions() as session:
            rows = session.execute(statement).all()
        return [
            Owner(uuid, node, url, epoch, expires, bool(live), max(0.0, float(left or 0)))
            for uuid, node, url, epoch, expires, live, left in rows
        ]

    def node_live(self, node: str) -> bool:
        """Has ``node`` heartbeated within a lease? (A frozen or dead node stops.)"""
        statement = select(Node.id).where(
            Node.id == node, Node.heartbeat_at >= func.now() - self.span
        )
        with self.sessions() as session:
            return session.execute(statement).one_or_none() is not None

    def live_nodes(self) -> list[NodeLoad]:
        """Nodes ready (Ceph client not blocklisted, not stopping) whose heartbeat is younger than a lease,
        with how many volumes each owns: where a volume may be placed or moved."""
        owned = (
            select(Volume.owner_node, func.count().label("volumes"))
            .where(Volume.lease_expires_at >= func.now())
            .group_by(Volume.owner_node)
            .subquery()
        )
        statement = (
            select(Node.id, Node.url, func.coalesce(owned.c.volumes, 0))
            .outerjoin(owned, owned.c.owner_node == Node.id)
            .where(Node.heartbeat_at >= func.now() - self.span, Node.ready.is_(True))
            .order_by(Node.id)
        )
        with self.sessions() as session:
            return [NodeLoad(node, url, count) for node, url, count in session.execute(statement)]


def hold(session: Session, uuid: str, node: str, epoch: int) -> bool:
    """Inside a lifecycle transaction: is the lease still ours at this epoch? Locks the row
    (``FOR UPDATE``) so no takeover commits between this check and the transaction's end."""
    statement = (
        select(Volume.id)
        .where(
            Volume.uuid == uuid,
            Volume.owner_node == node,
            Volume.lease_epoch == epoch,
            Volume.lease_expires_at >= func.now(),
        )
        .with_for_update()
    )
    return session.execute(statement).one_or_none() is not None


def own_new(session: Session, uuid: str, node: str, lease_seconds: float) -> Lease:
    """Inside the creating transaction: the new volume's first lease, epoch 1."""
    statement = (
        update(Volume)
        .where(Volume.uuid == uuid)
        .values(
            owner_node=node,
            lease_expires_at=func.now() + timedelta(seconds=lease_seconds),
            lease_epoch=1,
        )
        .returning(Volume.uuid, Volume.name, Volume.lease_epoch, Volume.lease_expires_at)
    )
    return _lease(*session.execute(statement).one())
