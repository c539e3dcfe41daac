"""Two nodes under load while the faults clusters meet are injected, judged by the history
checker (``tests/support/history.py``): every block linearizable as a register, no flushed
write lost, no read of a value never written, never two nodes acknowledging writes at once.

Each node reaches PostgreSQL through a fault proxy of its own (``tests/support/faults.py``)
and advertises its URL through another, so the test can cut, or black-hole, one node's
database link or the nodes' link to each other while clients still reach them. Every
scenario runs on an RBD-backed and a file-backed volume (the compose layout: both nodes
share one data directory) for one cycle in the test suite and ``REQCRYPT_FAULT_CYCLES``
(5) in the bench suite (``pytest -m bench``), and reports the checker's verdict, the
takeover and the unavailable window (``-s`` shows them).

A crash (``History.crash``) is recorded where the volume may lose unflushed writes: when
another node is seen holding its lease after its owner was cut off, paused or starved of
the database (the old owner dropped it without a flush).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.support import ceph
from tests.support.cluster import (
    LEASE,
    SETTLE,
    Node,
    http,
    make_rbd_volume,
    owner,
    wait_owner,
)
from tests.support.factories import xts_table
from tests.support.faults import FaultProxy, Pauser
from tests.support.history import History, check
from tests.support.load import ClusterLoad

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.slow]

FULL_CYCLES = int(os.environ.get("REQCRYPT_FAULT_CYCLES", "5"))
STORES = ["file", pytest.param("rbd", marks=pytest.mark.ceph)]
SIZE = 4 << 20


@pytest.fixture(
    params=[1, pytest.param(FULL_CYCLES, marks=pytest.mark.bench)], ids=["short", "full"]
)
def cycles(request: pytest.FixtureRequest) -> int:
    """One cycle of each fault in the test suite; the bench runs the full count."""
    count: int = request.param
    return count


@dataclass
class FaultyNode:
    node: Node
    database: FaultProxy
    advertised: FaultProxy


@dataclass
class Cluster:
    store: str
    nodes: dict[str, FaultyNode]
    history: History = field(default_factory=History)

    def urls(self) -> dict[str, str]:
        """Every base URL a response may come from, to the node it belongs to."""
        urls = {}
        for node_id, faulty in self.nodes.items():
            urls[faulty.node.base] = node_id
            urls[f"http://127.0.0.1:{faulty.advertised.port}"] = node_id
        return urls

    def owner_id(self) -> str:
        for faulty in self.nodes.values():
            shown = owner(faulty.node)
            if shown is not None:
                return str(shown["node"])
        raise AssertionError("no node shows an owner")

    def other(self, node_id: str) -> FaultyNode:
        (other,) = [faulty for key, faulty in self.nodes.items() if key != node_id]
        return other

    def wait_taken_from(self, node_id: str) -> str:
        """Until another node holds the lease (asked of that node); records the crash."""
        survivor = self.other(node_id).node
        wait_owner(survivor, survivor.node_id)
        self.history.crash("v")
        return survivor.node_id

    def wait_served(self) -> None:
        """Until some node serves the volume again after the faults healed."""
        deadline = time.monotonic() + SETTLE
        while not any(faulty.node.serves() for faulty in self.nodes.values()):
            assert time.monotonic() < deadline, "nobody serves the volume after healing"
            time.sleep(0.1)

    def load(self, entries: list[str]) -> ClusterLoad:
        return ClusterLoad(self.history, entries, self.urls(), seed=len(self.history.operations()))

    def verdict(self, load: ClusterLoad) -> None:
        self.wait_served()
        load.final_reads(next(iter(self.nodes.values())).node.base)
        verdict = check(self.history)
        assert verdict.valid, str(verdict)


def proxied(url: str, port: int) -> str:
    """``url`` with its port replaced: the node's way to PostgreSQL through its proxy."""
    parts = urlsplit(url)
    user = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit(parts._replace(netloc=f"{user}{parts.hostname}:{port}"))


@pytest.fixture(params=STORES)
def cluster(request: pytest.FixtureRequest, tmp_path: Path, postgres_url: str) -> Iterator[Cluster]:
    store: str = request.param
    database = urlsplit(postgres_url)
    upstream = (database.hostname or "127.0.0.1", database.port or 5432)
    prefix = f"f{uuid.uuid4().hex[:8]}-"
    ceph_cluster = request.getfixturevalue("ceph_cluster") if store == "rbd" else None
    nodes: dict[str, FaultyNode] = {}
    with contextlib.ExitStack() as stack:
        for node_id in ("a", "b"):
            db_proxy = stack.enter_context(FaultProxy(upstream))
            node = Node(tmp_path / "data", proxied(postgres_url, db_proxy.port), node_id)
            advertised = stack.enter_context(FaultProxy(("127.0.0.1", node.port)))
            node.env["REQCRYPT_NODE_URL"] = f"http://127.0.0.1:{advertised.port}"
            if ceph_cluster is not None:
                node.env["REQCRYPT_CEPH_CONF"] = str(ceph_cluster.conf)
                node.env["REQCRYPT_RBD_IMAGE_PREFIX"] = prefix
            nodes[node_id] = FaultyNode(node, db_proxy, advertised)
        try:
            for faulty in nodes.values():
                faulty.node.launch()
            for faulty in nodes.values():
                faulty.node.start_wait()
            a = nodes["a"].node
            if store == "rbd":
                make_rbd_volume(a)
            else:
                with http(a) as client:
                    response = client.post("/v1/devices", json={"name": "pv", "size_bytes": SIZE})
                    assert response.status_code == 201, response.text
                    response = client.post(
                        "/v1/volumes", json={"name": "v", "table": xts_table("pv", SIZE // 512)}
                    )
                    assert response.status_code == 201, response.text
            wait_owner(a, "a")
            yield Cluster(store, nodes)
        finally:
            for faulty in nodes.values():
                faulty.database.restore()
                faulty.advertised.restore()
                if faulty.node.process is not None:
                    faulty.node.process.send_signal(signal.SIGCONT)
                    faulty.node.stop()
            if ceph_cluster is not None:
                for image in ceph_cluster.images():
                    if image.startswith(prefix):
                        ceph_cluster.run("rbd", "rm", f"{ceph.POOL}/{image}")


def run(
    scenario: str,
    cluster: Cluster,
    cycles: int,
    inject: Callable[[str], None],
    entries: list[str] | None = None,
) -> None:
    """Load the volume through ``entries`` (every node by default), ``inject`` the fault
    ``cycles`` times (given the owner at the time), heal, judge the history and print the
    scenario's figures (shown with -s)."""
    entries = entries or [faulty.node.base for faulty in cluster.nodes.values()]
    with cluster.load(entries) as load:
        for _ in range(cycles):
            time.sleep(0.5)
            before = cluster.owner_id()
            fault = time.monotonic_ns()
            inject(before)
    cluster.verdict(load)
    seen = load.availability(fault, before)
    takeover = "none" if seen.takeover_s is None else f"{seen.takeover_s:.2f} s"
    print(  # noqa: T201 - the scenario's figures
        f"\n{scenario} [{cluster.store}]: checker valid, {len(cluster.history.operations())} "
        f"operations, takeover {takeover}, longest unavailable {seen.unavailable_s:.2f} s"
    )


def test_an_owner_cut_off_from_postgresql_stops_writing_before_its_lease_can_be_taken(
    cluster: Cluster, cycles: int
) -> None:
    """Its renewals black-holed, the owner refuses I/O past its local deadline, which ends
    before the database lets another node take the lease: never two writers."""

    def inject(before: str) -> None:
        cluster.nodes[before].database.drop()
        cluster.wait_taken_from(before)
        time.sleep(0.5)
        cluster.nodes[before].database.restore()
        cluster.nodes[before].node.wait_dropped()

    run("owner cut off from PostgreSQL", cluster, cycles, inject)


def test_an_owner_paused_past_its_lease_with_writes_in_flight_never_writes_after_takeover(
    cluster: Cluster, cycles: int
) -> None:
    """SIGSTOP the owner for twice the lease while clients write to it, then SIGCONT. RBD:
    the takeover blocklisted it, so its late writes fail. File: it still holds the device's
    flock, so the other node cannot serve until it wakes, finishes and lets go."""

    def inject(before: str) -> None:
        paused = cluster.nodes[before].node
        assert paused.process is not None
        with Pauser(paused.process.pid):
            if cluster.store == "rbd":
                cluster.wait_taken_from(before)  # the other node breaks its lock meanwhile
            time.sleep(2 * LEASE)
        paused.wait_dropped()
        if cluster.store == "file":
            cluster.history.crash("v")  # it let the device go unflushed: now the other takes it
            cluster.wait_taken_from(before)

    run("owner paused past its lease", cluster, cycles, inject)


def test_postgresql_restarting_mid_load_loses_no_flushed_write(
    cluster: Cluster, cycles: int
) -> None:
    """Every node's database connections reset and refused for longer than a lease (what
    a restart looks like from the nodes), then back."""

    def inject(_: str) -> None:
        for faulty in cluster.nodes.values():
            faulty.database.cut()
        time.sleep(LEASE + 1)
        for faulty in cluster.nodes.values():
            faulty.database.restore()
        cluster.wait_served()
        cluster.history.crash("v")  # the owner dropped it when its deadline passed
        time.sleep(0.5)

    run("PostgreSQL restart", cluster, cycles, inject)


def test_a_partition_between_the_nodes_leaves_relayed_clients_unanswered_not_wrong(
    cluster: Cluster, cycles: int
) -> None:
    """Clients of the other node reach the owner only through it (redirected to the owner's
    advertised URL); cutting that link leaves them without answers for its length, and
    nothing they were told is wrong."""

    def inject(before: str) -> None:
        cluster.nodes[before].advertised.cut()
        time.sleep(LEASE)
        cluster.nodes[before].advertised.restore()
        time.sleep(0.5)

    entries = [cluster.other("a").node.base]
    run("node partition, clients through the other node", cluster, cycles, inject, entries)


@pytest.mark.ceph
@pytest.mark.parametrize("cluster", ["rbd"], indirect=True)
def test_a_stalled_osd_makes_io_wait_or_fail_never_lose_an_acknowledged_write(
    cluster: Cluster, ceph_cluster: ceph.Cluster, cycles: int
) -> None:
    def inject(_: str) -> None:
        with ceph_cluster.osd_paused():
            time.sleep(LEASE)
        time.sleep(1.0)

    run("OSD stalled", cluster, cycles, inject)
