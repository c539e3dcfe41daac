"""Two real cluster nodes sharing PostgreSQL and the throwaway Ceph cluster: failover and
fencing of a volume on an RBD device, where the image's exclusive lock does the fencing.

A node taking a volume over breaks the previous holder's lock (``claim(take_over=True)``),
which blocklists that holder's librados client: a dead owner cannot block the takeover,
and a frozen one can never write to the image again once it wakes.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable

import httpx
import pytest

from app.storage.rbd import CephCluster, RbdStore
from tests.support import ceph
from tests.support.cluster import (
    SETTLE,
    Node,
    http,
    kill_and_fail_over,
    make_rbd_volume,
    read,
    wait_owner,
    write,
    write_flushed,
)
from tests.support.factories import xts_table
from tests.support.servers import pattern

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.ceph]

SIZE = 4 << 20


def blocklist(cluster: ceph.Cluster) -> set[str]:
    """The client addresses the OSDs refuse (the first of the two lists printed: the
    second holds address ranges)."""
    printed = cluster.run("ceph", "osd", "blocklist", "ls", "--format", "json").strip()
    listed, _ = json.JSONDecoder().raw_decode(printed)
    return {entry["addr"] for entry in listed}


@pytest.mark.slow
def test_a_killed_rbd_owner_fails_over_with_flushed_data_intact(
    rbd_cluster: tuple[Callable[[str], Node], str], ceph_cluster: ceph.Cluster
) -> None:
    """SIGKILL the owner while it holds the image's lock: the survivor breaks the dead
    client's lock once the lease runs out and serves every write flushed before."""
    make, _ = rbd_cluster
    a, b = make("a"), make("b")
    a.start()
    b.start()
    make_rbd_volume(a)
    kill_and_fail_over(a, b)
    data = pattern(65536, 65536)
    with http(b) as client:
        write_flushed(client, 65536, data)  # b holds the lock now
        assert read(client, 65536, 65536) == data
    assert b.metric("reqcrypt_node_takeovers_total") >= 1


@pytest.mark.slow
def test_a_frozen_rbd_owner_is_blocklisted_and_never_writes_again(
    rbd_cluster: tuple[Callable[[str], Node], str], ceph_cluster: ceph.Cluster
) -> None:
    """SIGSTOP the owner past its lease: unlike a file-backed device (whose lock the
    stopped process keeps), b breaks the image's lock, blocklisting a, and serves the
    data as last flushed at once. On SIGCONT a finds its lease gone and drops the volume
    without writing (the image's bytes stay as they were); a write or flush sent to it
    then is redirected to b. a then reconnects (ready again) while b keeps the volume."""
    make, prefix = rbd_cluster
    image = f"{prefix}pv"
    a, b = make("a"), make("b")
    a.start()
    b.start()
    make_rbd_volume(a)
    before = pattern(0, 4096)
    with http(a) as client:
        write_flushed(client, 0, before)
    blocklisted = blocklist(ceph_cluster)
    a.signal(signal.SIGSTOP)
    # Polled on b's metrics: a request b forwards to the frozen a would hang until its
    # forwarding timeout.
    deadline = time.monotonic() + SETTLE
    while b.metric("reqcrypt_node_volumes_owned") != 1:  # served while a is still frozen
        assert time.monotonic() < deadline, "b never took the volume over from frozen a"
        time.sleep(0.1)
    assert b.metric("reqcrypt_node_volumes_pending") == 0  # no claim blocked: lock broken
    assert len(blocklist(ceph_cluster) - blocklisted) == 1  # a's client, by b's takeover
    with http(b) as client:
        assert read(client, 0, 4096) == before
    stored = ceph_cluster.export(image)
    a.signal(signal.SIGCONT)
    a.wait_dropped()
    assert a.metric("reqcrypt_node_volumes_owned") == 0
    assert a.metric("reqcrypt_node_leases_lost_total") >= 1
    with http(a) as client:
        late = write(client, 0, b"\xff" * 4096)
        flushed = client.post("/v1/volumes/v/flush")
    assert late.status_code == 307, late.status_code
    assert late.headers["location"] == f"{b.base}/v1/volumes/v/data"
    assert flushed.status_code == 307, flushed.status_code
    assert flushed.headers["location"] == f"{b.base}/v1/volumes/v/flush"
    # a learns it was blocklisted when releasing the image or from its /readyz probe,
    # whichever comes first, and is ready again on a new client
    deadline = time.monotonic() + SETTLE
    while httpx.get(f"{a.base}/readyz", timeout=30).status_code != 200:
        assert time.monotonic() < deadline, "a never reconnected to Ceph"
        time.sleep(0.2)
    assert a.metric("reqcrypt_node_reconnects_total") == 1
    assert ceph_cluster.export(image) == stored
    with http(b) as client:
        assert read(client, 0, 4096) == before
        assert client.get("/v1/volumes/v").json()["owner"]["node"] == "b"


@pytest.mark.slow
def test_a_blocklisted_node_hands_its_rbd_volumes_over_and_reconnects(
    rbd_cluster: tuple[Callable[[str], Node], str], ceph_cluster: ceph.Cluster
) -> None:
    """Another client breaks the lock of one of a's images (what a takeover does), which
    blocklists a's whole Ceph connection. At its first refused write a releases the lease
    of every RBD volume at once — b takes them without waiting for a lease to expire —
    keeps serving its file-backed volume, then opens a new Ceph connection and is ready
    to serve RBD volumes again (here: one moved back to it)."""
    make, prefix = rbd_cluster
    a, b = make("a"), make("b")
    a.start()
    make_rbd_volume(a, "v1", "p1")
    make_rbd_volume(a, "v2", "p2")
    with http(a) as client:
        assert client.post("/v1/devices", json={"name": "pf", "size_bytes": SIZE}).is_success
        created = client.post("/v1/volumes", json={"name": "f", "table": xts_table("pf", 2048)})
        assert created.status_code == 201, created.text
        write_flushed(client, 0, pattern(0, 4096), "v2")
    b.start()  # after the creates: every volume is a's
    thieves = CephCluster(ceph_cluster.conf)
    try:
        thief = RbdStore(thieves.ioctx(ceph.POOL), f"{prefix}p1", SIZE)
        thief.claim(take_over=True)  # breaks a's lock: a's client is blocklisted
        thief.close()
    finally:
        thieves.close()
    with http(a) as client:
        refused = write(client, 0, b"x" * 4096, "v1")
        assert refused.status_code == 503, refused.text
    for name in ("v1", "v2"):  # released, not expired: a renews nothing any more
        wait_owner(b, "b", name)
    with http(b) as client:
        assert read(client, 0, 4096, "v2") == pattern(0, 4096)
    with http(a) as client:
        write_flushed(client, 0, pattern(0, 4096), "f")  # file-backed: still a's
        assert client.get("/v1/volumes/f").json()["owner"]["node"] == "a"
    deadline = time.monotonic() + SETTLE
    while httpx.get(f"{a.base}/readyz", timeout=30).status_code != 200:
        assert time.monotonic() < deadline, "a never reconnected to Ceph"
        time.sleep(0.2)
    assert a.metric("reqcrypt_node_reconnects_total") == 1
    with http(b) as client:
        moved = client.post("/v1/volumes/v1/move", json={"node": "a"})
        assert moved.status_code == 200, moved.text
    with http(a) as client:
        write_flushed(client, 8192, pattern(8192, 4096), "v1")
        assert read(client, 8192, 4096, "v1") == pattern(8192, 4096)
