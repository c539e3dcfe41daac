"""One ``ClusterNode`` on the real PostgreSQL whose Ceph client is blocklisted and cannot
reconnect: what it keeps, what it gives up, and that placement leaves it alone."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from app.cluster import ClusterNode
from app.cluster.serving import ServingSet
from app.config import Settings
from app.control.catalog import CatalogedDevice
from app.db.leases import Leases
from app.db.models import Volume
from app.db.session import make_engine, make_sessionmaker
from app.errors import Unavailable
from app.storage.registry import DeviceRegistry, Placement
from tests.support.control import make_control
from tests.support.factories import xts_table

pytestmark = pytest.mark.postgres

LEASE = 30.0
SIZE = 1 << 20


class UnreachableCeph:
    """Stands in for ``CephCluster``: blocklisted on demand, and no new connection can be
    made (the monitors are away), so the node stays blocklisted."""

    def __init__(self) -> None:
        self.blocklisted = False
        self.attempts = 0

    def reconnect(self, close_images: Callable[[], None]) -> None:
        self.attempts += 1
        raise Unavailable("Ceph cluster is unreachable")

    def close(self) -> None:
        pass


@pytest.fixture
def node(migrated_postgres_url: str, tmp_path: Path) -> Iterator[tuple[ClusterNode, Any]]:
    """Node a serving volume ``f`` on a file device and ``r`` on a device recorded as RBD
    (its bytes in a file here: only its placement matters to the node), and the fake
    Ceph connection."""
    engine = make_engine(migrated_postgres_url)
    sessions = make_sessionmaker(engine)
    ceph = UnreachableCeph()
    devices = DeviceRegistry(tmp_path / "devices")
    devices.ceph = ceph  # type: ignore[assignment]
    settings = Settings(
        database_url=migrated_postgres_url,
        node_id="a",
        node_url="http://a",
        lease_seconds=LEASE,
        lease_renew_seconds=1,
        plug_window_us=0,
        suspend_wait_seconds=0.5,
    )
    serving = ServingSet(Leases(sessions, "a", LEASE), devices)
    control = make_control(sessions, devices, guard=serving, settings=settings.control)
    for device in ("pf", "pr"):
        control.create_device(device, SIZE, None)
    control.catalog.add(CatalogedDevice("pr", SIZE, None, Placement("rbd", "rbd", "reqcrypt-pr")))
    control.create_volume("f", xts_table("pf", SIZE // 512))
    control.create_volume("r", xts_table("pr", SIZE // 512))
    assert settings.cluster is not None
    cluster = ClusterNode(control, serving, settings.cluster)
    cluster.tick()
    yield cluster, ceph
    control.close()
    engine.dispose()


def owners(cluster: ClusterNode) -> dict[str, str | None]:
    with cluster.leases.sessions() as session:
        rows = session.execute(select(Volume.name, Volume.owner_node)).all()
    return {row.name: row.owner_node for row in rows}


def test_a_blocklisted_node_releases_its_rbd_volumes_and_keeps_its_file_volumes(
    node: tuple[ClusterNode, UnreachableCeph],
) -> None:
    cluster, ceph = node
    ceph.blocklisted = True
    cluster.tick()
    assert owners(cluster) == {"f": "a", "r": None}  # r free for another node at once
    assert cluster._reconnecting is not None
    cluster._reconnecting.join(timeout=30)
    assert sorted(cluster.control.served()) == ["f"]
    assert ceph.attempts == 1


def test_a_blocklisted_node_is_no_placement_target_and_takes_no_rbd_volume(
    node: tuple[ClusterNode, UnreachableCeph],
) -> None:
    cluster, ceph = node
    assert [load.node for load in cluster.live_nodes()] == ["a"]
    ceph.blocklisted = True
    cluster.tick()
    assert cluster._reconnecting is not None
    cluster._reconnecting.join(timeout=30)
    cluster.serving.released.clear()  # past the lease it leaves r to the others: still blocklisted
    cluster.tick()  # r is free, and this node could take it: it must not
    assert cluster.live_nodes() == []
    assert cluster.place() is None
    assert owners(cluster) == {"f": "a", "r": None}
    assert ceph.attempts == 2  # it keeps trying to reconnect, once per tick


def test_a_volume_past_its_deadline_is_fenced_and_a_late_renewal_does_not_revive_it(
    node: tuple[ClusterNode, UnreachableCeph],
) -> None:
    cluster, _ = node
    serving = cluster.serving
    asked = serving.asked()
    renewed = cluster.leases.renew(asked)  # the database answers, but too late:
    fenced = {volume.name: volume for volume in serving.expired(float("inf"))}
    assert sorted(fenced) == ["f", "r"]
    serving.renewed(asked, renewed, deadline=1e18)
    for volume in fenced.values():
        assert not serving.serves(volume.uuid)
        assert volume.lease_deadline == float("-inf")


def test_nothing_is_fenced_before_its_deadline(node: tuple[ClusterNode, UnreachableCeph]) -> None:
    cluster, _ = node
    assert cluster.serving.expired(0.0) == []
    assert sorted(cluster.control.served()) == ["f", "r"]
