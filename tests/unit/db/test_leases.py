"""The lease statements against the real PostgreSQL: one owner, whatever the interleaving."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.orm import Session, sessionmaker

from app.db.leases import Lease, Leases, hold
from app.db.models import Volume
from app.db.session import make_engine, make_sessionmaker

pytestmark = pytest.mark.postgres

UUID = "00000000-0000-4000-8000-000000000001"


@pytest.fixture
def sessions(migrated_postgres_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(migrated_postgres_url)
    made = make_sessionmaker(engine)
    with made() as session, session.begin():
        session.add(Volume(uuid=UUID, name="v", queue_limits={}))
    yield made
    engine.dispose()


def expire(sessions: sessionmaker[Session]) -> None:
    with sessions() as session, session.begin():
        session.execute(update(Volume).values(lease_expires_at=text("now() - interval '1 second'")))


def race(sessions: sessionmaker[Session], nodes: list[str]) -> list[Lease | None]:
    """Every node calls ``take`` at once, while a transaction holds the row locked, so all
    of them queue on the lock and run the moment it is released."""
    results: list[Lease | None] = [None] * len(nodes)
    started = threading.Barrier(len(nodes) + 1)

    def take(index: int) -> None:
        started.wait()
        results[index] = Leases(sessions, nodes[index], 5).take(UUID)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(len(nodes))]
    with sessions() as blocker, blocker.begin():
        blocker.execute(select(Volume.id).with_for_update())
        for thread in threads:
            thread.start()
        started.wait()
        time.sleep(0.3)  # every take is now waiting on the row lock
    for thread in threads:
        thread.join(timeout=30)
    return results


def test_nodes_racing_for_a_free_lease_leave_exactly_one_owner(
    sessions: sessionmaker[Session],
) -> None:
    results = race(sessions, ["a", "b", "c", "d"])
    winners = [lease for lease in results if lease is not None]
    assert len(winners) == 1
    assert winners[0].epoch == 1
    with sessions() as session:
        owner = session.scalars(select(Volume.owner_node)).one()
    assert owner == ["a", "b", "c", "d"][results.index(winners[0])]


def test_nodes_racing_for_an_expired_lease_leave_exactly_one_new_owner(
    sessions: sessionmaker[Session],
) -> None:
    first = Leases(sessions, "a", 5).take(UUID)
    assert first is not None
    assert Leases(sessions, "b", 5).take(UUID) is None  # unexpired: refused
    expire(sessions)
    results = race(sessions, ["b", "c", "d"])
    winners = [lease for lease in results if lease is not None]
    assert len(winners) == 1
    assert winners[0].epoch == first.epoch + 1


def test_a_lease_lost_to_a_takeover_is_neither_renewed_nor_held(
    sessions: sessionmaker[Session],
) -> None:
    a, b = Leases(sessions, "a", 5), Leases(sessions, "b", 5)
    first = a.take(UUID)
    assert first is not None
    renewed = a.renew({UUID: first.epoch})
    assert renewed[UUID].epoch == first.epoch
    assert renewed[UUID].expires_at > first.expires_at
    expire(sessions)
    assert a.renew({UUID: first.epoch}) == {}  # expired: no renewal, even unclaimed
    taken = b.take(UUID)
    assert taken is not None
    assert a.renew({UUID: first.epoch}) == {}
    with sessions() as session, session.begin():
        assert not hold(session, UUID, "a", first.epoch)
        assert hold(session, UUID, "b", taken.epoch)


def test_a_hand_over_gives_the_target_the_next_epoch(sessions: sessionmaker[Session]) -> None:
    a, b, c = Leases(sessions, "a", 5), Leases(sessions, "b", 5), Leases(sessions, "c", 5)
    first = a.take(UUID)
    assert first is not None
    assert a.hand_over(UUID, first.epoch, "b")
    assert c.take(UUID) is None  # handed to b, unexpired: not free for c
    assert not a.hand_over(UUID, first.epoch, "c")  # no longer a's to give
    taken = b.take(UUID)
    assert taken is not None
    assert taken.epoch == first.epoch + 1


def test_a_released_lease_is_free_at_once(sessions: sessionmaker[Session]) -> None:
    a, b = Leases(sessions, "a", 5), Leases(sessions, "b", 5)
    first = a.take(UUID)
    assert first is not None
    a.release(UUID, first.epoch)
    assert b.take(UUID) is not None


def test_live_nodes_count_the_volumes_each_owns(sessions: sessionmaker[Session]) -> None:
    a, b = Leases(sessions, "a", 5), Leases(sessions, "b", 5)
    a.heartbeat("http://a")
    b.heartbeat("http://b")
    assert a.take(UUID) is not None
    loads = {node.node: (node.url, node.volumes) for node in a.live_nodes()}
    assert loads == {"a": ("http://a", 1), "b": ("http://b", 0)}
    owner = b.owner_of("v")
    assert owner is not None
    assert (owner.node, owner.url, owner.live) == ("a", "http://a", True)
    assert b.owner_of("nope") is None


def test_a_node_not_ready_is_no_placement_target_until_ready_again(
    sessions: sessionmaker[Session],
) -> None:
    a, b = Leases(sessions, "a", 5), Leases(sessions, "b", 5)
    a.heartbeat("http://a")
    b.heartbeat("http://b", ready=False)  # alive, but blocklisted by Ceph or stopping
    assert [node.node for node in a.live_nodes()] == ["a"]
    b.heartbeat("http://b")
    assert [node.node for node in a.live_nodes()] == ["a", "b"]


def test_a_node_is_live_while_its_heartbeat_is_younger_than_a_lease(
    sessions: sessionmaker[Session],
) -> None:
    a, b = Leases(sessions, "a", 5), Leases(sessions, "b", 5)
    a.heartbeat("http://a")
    assert b.node_live("a")
    with sessions() as session, session.begin():
        session.execute(text("UPDATE nodes SET heartbeat_at = now() - interval '6 seconds'"))
    assert not b.node_live("a")
    assert not b.node_live("nobody")


def test_owners_name_each_volume_s_holder_and_its_remaining_lease(
    sessions: sessionmaker[Session],
) -> None:
    a, b = Leases(sessions, "a", 5), Leases(sessions, "b", 5)
    a.heartbeat("http://a")
    assert b.owners()[UUID].node is None  # never taken
    assert a.take(UUID) is not None
    owner = b.owners()[UUID]
    assert (owner.node, owner.url, owner.live) == ("a", "http://a", True)
    assert 0 < owner.remaining_seconds <= 5
    expire(sessions)
    assert b.owners()[UUID].remaining_seconds == 0


def test_a_renewal_whose_node_falls_silent_mid_transaction_frees_the_row_for_a_takeover(
    sessions: sessionmaker[Session],
) -> None:
    """A partition swallows the renewal's answer: the node never commits. PostgreSQL ends
    that transaction within a quarter of the lease, so the next owner's take does not
    wait on its row lock for as long as the server takes to notice a dead peer."""
    a, b = Leases(sessions, "a", 1.0), Leases(sessions, "b", 1.0)
    first = a.take(UUID)
    assert first is not None
    expire(sessions)
    silent = a._writing()
    session = silent.__enter__()
    session.execute(update(Volume).values(lease_expires_at=text("now()")))  # the row is locked
    started = time.monotonic()
    taken = b.take(UUID)
    waited = time.monotonic() - started
    assert taken is not None
    assert taken.epoch == first.epoch + 1
    assert waited < 5  # the server's own dead-peer detection would take hours
    with pytest.raises(Exception, match="idle-in-transaction"):
        silent.__exit__(None, None, None)
