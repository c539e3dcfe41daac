"""Real cluster nodes (``reqcrypt serve`` with a node id over one PostgreSQL), and the
HTTP calls the cluster tests make of them.

Leases are short (3 s, renewed every 0.5 s) so failover happens in seconds; every
wait polls towards a generous deadline, as the machine running the suite is busy.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.factories import xts_table
from tests.support.ports import wait_ready
from tests.support.servers import HEADERS, REQCRYPT, Server, pattern

CLUSTER_METRIC = re.compile(r"reqcrypt_(node_|volume_lease_)")
"""Metrics only a cluster node (REQCRYPT_NODE_ID) exports."""

LEASE = 3.0
RENEW = 0.5
MASTER_KEY = "5a" * 32
SETTLE = 30.0
"""Longest wait for a node to notice something (a lease is 3 s; the machine is busy)."""


class Node(Server):
    def __init__(self, data_dir: Path, database_url: str, node_id: str, **env: str) -> None:
        super().__init__(
            data_dir,
            REQCRYPT_DATABASE_URL=database_url,
            REQCRYPT_NODE_ID=node_id,
            REQCRYPT_LEASE_SECONDS=str(LEASE),
            REQCRYPT_LEASE_RENEW_SECONDS=str(RENEW),
            REQCRYPT_MASTER_KEY=MASTER_KEY,
            REQCRYPT_SUSPEND_WAIT_SECONDS="2",
            **env,
        )
        self.node_id = node_id

    def launch(self) -> None:
        """Start without waiting for readiness (to race several nodes)."""
        log = (self.data_dir.parent / f"node-{self.node_id}.log").open("ab")
        self.process = subprocess.Popen(
            [REQCRYPT, "serve"], env=self.environ("info"), stdout=log, stderr=log
        )
        log.close()

    def start(self) -> None:
        self.launch()
        self.start_wait()

    def start_wait(self) -> None:
        """Ready within 2 minutes: several interpreters importing at once on a busy machine
        take far longer than one."""
        assert self.process is not None
        wait_ready(f"{self.base}/readyz", self.process, 120, f"node {self.node_id}")

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=15)
        self.process = None

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def serves(self, name: str = "v") -> bool:
        """Whether this node serves volume ``name`` itself, asked of this node alone (a
        volume's own metrics are exported by the node serving it, nothing is forwarded)."""
        text = httpx.get(f"{self.base}/metrics", timeout=10).text
        return f'reqcrypt_volume_in_flight{{volume="{name}"}}' in text

    def wait_dropped(self, name: str = "v") -> None:
        """Until this node no longer serves ``name`` (it found its lease gone and dropped
        the volume): from then on it routes the volume's requests to the lease's owner."""
        deadline = time.monotonic() + SETTLE
        while self.serves(name):
            assert time.monotonic() < deadline, f"{self.node_id} never dropped volume {name}"
            time.sleep(0.1)

    def metric(self, name: str) -> float:
        text = httpx.get(f"{self.base}/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith(f'{name}{{node="{self.node_id}"}}'):
                return float(line.split()[-1])
        raise AssertionError(f"{name} not in /metrics")


def bearer_on_every_hop(request: httpx.Request) -> None:
    """httpx (like curl -L without --location-trusted) drops Authorization when a redirect
    leaves the origin, and another node is another origin: a request hook sets it again
    on every request of the chain."""
    request.headers["Authorization"] = HEADERS["Authorization"]


def http(node: Node, *, follow: bool = False) -> httpx.Client:
    return httpx.Client(
        base_url=node.base,
        headers=HEADERS,
        timeout=60,
        follow_redirects=follow,
        event_hooks={"request": [bearer_on_every_hop]} if follow else {},
    )


def write(client: httpx.Client, offset: int, data: bytes, name: str = "v") -> httpx.Response:
    return client.put(
        f"/v1/volumes/{name}/data",
        content=data,
        headers={"Content-Range": f"bytes {offset}-{offset + len(data) - 1}/*"},
    )


def write_flushed(client: httpx.Client, offset: int, data: bytes, name: str = "v") -> None:
    """A write the volume acknowledged, then a completed flush: data that must survive."""
    assert write(client, offset, data, name).status_code == 204
    assert client.post(f"/v1/volumes/{name}/flush").status_code == 204


def read(client: httpx.Client, offset: int, length: int, name: str = "v") -> bytes:
    response = client.get(
        f"/v1/volumes/{name}/data", headers={"Range": f"bytes={offset}-{offset + length - 1}"}
    )
    assert response.status_code == 206, response.text
    return response.content


def owner(node: Node, name: str = "v") -> dict[str, Any] | None:
    """The volume's owner as ``node`` answers (forwarded to the owner if need be)."""
    with http(node) as client:
        response = client.get(f"/v1/volumes/{name}")
    if response.status_code != 200:
        return None
    answer: dict[str, Any] | None = response.json()["owner"]
    return answer


def wait_owner(node: Node, expected: str, name: str = "v") -> float:
    """Seconds until ``node`` serves ``name`` itself (the owner it shows is ``expected``)."""
    started = time.monotonic()
    while time.monotonic() - started < SETTLE:
        shown = owner(node, name)
        if shown is not None and shown["node"] == expected:
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"{expected} never served volume {name}")


def kill_and_fail_over(owner: Node, survivor: Node) -> None:
    """Flush a write on ``owner``'s volume ``v``, SIGKILL it: ``survivor`` serves ``v``
    within a lease and a scan, and reads the write back."""
    data = pattern(0, 65536)
    with http(owner) as client:
        write_flushed(client, 0, data)
    owner.kill()
    took = wait_owner(survivor, survivor.node_id)
    # The lease runs out (3 s), then the survivor's next scan takes it (every 0.5 s).
    assert took < LEASE + 10 * RENEW, took
    with http(survivor) as client:
        assert read(client, 0, 65536) == data


RBD_SIZE = 4 << 20


def make_rbd_volume(node: Node, name: str = "v", device: str = "pv") -> None:
    with http(node) as client:
        response = client.post(
            "/v1/devices", json={"name": device, "size_bytes": RBD_SIZE, "store": "rbd"}
        )
        assert response.status_code == 201, response.text
        response = client.post(
            "/v1/volumes", json={"name": name, "table": xts_table(device, RBD_SIZE // 512)}
        )
        assert response.status_code == 201, response.text
