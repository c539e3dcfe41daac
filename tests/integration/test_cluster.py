"""Several real ``reqcrypt serve`` nodes sharing one PostgreSQL and one data directory.

Leases are short (3 s, renewed every 0.5 s) so failover happens in seconds; every
wait polls towards a generous deadline, as the machine running the suite is busy.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.cluster import (
    CLUSTER_METRIC,
    LEASE,
    RENEW,
    SETTLE,
    Node,
    http,
    kill_and_fail_over,
    owner,
    read,
    wait_owner,
    write,
    write_flushed,
)
from tests.support.database import fresh_postgres_database
from tests.support.factories import xts_table
from tests.support.keys import XTS_KEY
from tests.support.servers import HEADERS, pattern, read_response

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

SIZE = 1 << 20


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Node, Node]]:
    """Nodes a and b, started once for the tests that leave both running (each test uses
    volumes of its own names)."""
    if os.environ.get("REQCRYPT_SKIP_POSTGRES") == "1":
        pytest.skip("REQCRYPT_SKIP_POSTGRES=1")
    data_dir = tmp_path_factory.mktemp("pair") / "data"
    with fresh_postgres_database() as url:
        nodes = (Node(data_dir, url, "a"), Node(data_dir, url, "b"))
        try:
            for node in nodes:
                node.launch()
            for node in nodes:
                node.start_wait()
            yield nodes
        finally:
            for node in nodes:
                if node.process is not None:
                    node.stop()


def owner_and_other(pair: tuple[Node, Node], name: str) -> tuple[Node, Node]:
    shown = owner(pair[0], name)
    assert shown is not None
    return (pair[0], pair[1]) if shown["node"] == pair[0].node_id else (pair[1], pair[0])


@pytest.fixture
def cluster(tmp_path: Path, postgres_url: str) -> Iterator[Callable[..., Node]]:
    """``cluster("a")`` makes a node (not started), ``cluster("b", REQCRYPT_…="…")`` one
    with more settings; every node is stopped afterwards."""
    nodes: list[Node] = []

    def make(node_id: str, **env: str) -> Node:
        node = Node(tmp_path / "data", postgres_url, node_id, **env)
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        if node.process is not None:
            node.process.send_signal(signal.SIGCONT)
            node.stop()


def make_volume(node: Node, name: str = "v", device: str = "pv") -> None:
    with http(node) as client:
        response = client.post("/v1/devices", json={"name": device, "size_bytes": SIZE})
        assert response.status_code == 201, response.text
        response = client.post(
            "/v1/volumes", json={"name": name, "table": xts_table(device, SIZE // 512)}
        )
        assert response.status_code == 201, response.text


HALF = SIZE // 2


def stack_on(node: Node, name: str, lower: str) -> httpx.Response:
    """Create ``name`` over the second half of volume ``lower`` (the first half stays the
    lower volume's own, to read both levels apart)."""
    sectors = HALF // 512
    table = f"0 {sectors} crypt aes-xts-plain64 {XTS_KEY} 0 /dev/mapper/{lower} {sectors}"
    with http(node) as client:
        return client.post("/v1/volumes", json={"name": name, "table": table})


@pytest.mark.slow
def test_nodes_racing_for_one_free_lease_give_it_one_owner(
    cluster: Callable[..., Node],
) -> None:
    """Three processes: one creates the volume and stops (releasing its lease), then two
    start at once and race to take it; both then name the same single owner."""
    first = cluster("a")
    first.start()
    make_volume(first)
    first.stop()
    racers = [cluster("b"), cluster("c")]
    for node in racers:
        node.launch()
    for node in racers:
        node.start_wait()
    deadline = time.monotonic() + SETTLE
    while True:
        owners = [owner(node) for node in racers]
        if all(shown is not None for shown in owners) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert owners[0] is not None
    assert owners[1] is not None
    assert owners[0]["node"] == owners[1]["node"]
    owned = [node.metric("reqcrypt_node_volumes_owned") for node in racers]
    assert sorted(owned) == [0, 1]
    assert owners[0]["lease_epoch"] == 2  # created (1), then taken once more


@pytest.mark.slow
def test_a_killed_owner_fails_over_with_flushed_data_intact(
    cluster: Callable[..., Node],
) -> None:
    a, b = cluster("a"), cluster("b")
    a.start()
    b.start()
    make_volume(a)
    kill_and_fail_over(a, b)
    assert b.metric("reqcrypt_node_takeovers_total") >= 1


@pytest.mark.slow
def test_a_frozen_owner_drops_the_volume_without_writing(
    cluster: Callable[..., Node],
) -> None:
    """SIGSTOP the owner past its lease: b takes the lease but cannot claim the device file
    (the stopped process still holds its lock: a file cannot fence a live holder), so
    nothing is served. On SIGCONT the owner finds its lease gone and drops the volume and
    its lock without writing; a write sent to it then is redirected to the lease's owner,
    b, which serves the data as last flushed."""
    a, b = cluster("a"), cluster("b")
    a.start()
    b.start()
    make_volume(a)
    before = pattern(0, 4096)
    with http(a) as client:
        write_flushed(client, 0, before)
    a.signal(signal.SIGSTOP)
    deadline = time.monotonic() + SETTLE
    while b.metric("reqcrypt_node_volumes_pending") != 1:
        assert time.monotonic() < deadline, "b never took the expired lease"
        time.sleep(0.1)
    with http(b) as client:
        assert client.get("/v1/volumes/v").status_code == 503  # b owns it, cannot serve yet
    a.signal(signal.SIGCONT)
    a.wait_dropped()
    with http(a) as client:
        late = write(client, 0, b"\xff" * 4096)
    assert late.status_code == 307, late.status_code
    assert late.headers["location"] == f"{b.base}/v1/volumes/v/data"
    wait_owner(b, "b")
    with http(b) as client:
        assert read(client, 0, 4096) == before
    assert a.metric("reqcrypt_node_leases_lost_total") >= 1
    assert a.metric("reqcrypt_node_volumes_owned") == 0


def assert_given_up_within_about_a_lease(answer: httpx.Response, waited: float) -> None:
    """The answer of a node that gave up on a frozen owner once its heartbeat was a lease
    old: 503 problem+json with Retry-After, well before any client timeout."""
    assert answer.status_code == 503
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.headers["Retry-After"] == "1"
    assert "stopped heartbeating" in answer.json()["detail"]
    assert waited < LEASE + 10 * RENEW, waited


@pytest.mark.slow
def test_a_control_call_forwarded_to_a_frozen_owner_answers_503_within_about_a_lease(
    cluster: Callable[[str], Node],
) -> None:
    """The owner freezes (SIGSTOP) while another node forwards a call to it: the forwarding
    node gives up once the owner's heartbeat is a lease old, not at a fixed timeout
    (suspend_wait_seconds + 30 s before), and answers 503 with Retry-After."""
    a, b = cluster("a"), cluster("b")
    a.start()
    b.start()
    make_volume(a)
    frozen, forwarding = owner_and_other((a, b), "v")
    frozen.signal(signal.SIGSTOP)
    started = time.monotonic()
    with http(forwarding) as client:
        answer = client.get("/v1/volumes/v")
    assert_given_up_within_about_a_lease(answer, time.monotonic() - started)


def test_any_node_lists_every_volume_of_the_cluster_with_its_owner(
    pair: tuple[Node, Node],
) -> None:
    """Each node lists the volumes the other serves too, as their owner shows them (the
    other's from SQL: state, tables, tuning), with the owner's node and URL."""
    make_volume(pair[0], "la", "pla")
    make_volume(pair[0], "lb", "plb")
    first, second = owner_and_other(pair, "la")
    if owner_and_other(pair, "lb")[0] is first:
        with http(first) as client:
            assert client.post("/v1/volumes/lb/move", json={"node": second.node_id}).is_success
    with http(first) as client:
        assert client.post("/v1/volumes/lb/suspend").status_code == 200  # runs on second
        patched = client.patch("/v1/volumes/lb", json={"dispatch_mode": "bio"})
        assert patched.status_code == 200
    shown = {}
    for name, served_by in (("la", first), ("lb", second)):
        with http(served_by) as client:
            shown[name] = client.get(f"/v1/volumes/{name}").json()
    for node in pair:
        with http(node) as client:
            listed = {volume["name"]: volume for volume in client.get("/v1/volumes").json()}
        for name, served_by in (("la", first), ("lb", second)):
            entry = listed[name]
            assert entry["owner"]["node"] == served_by.node_id
            assert entry["owner"]["url"] == served_by.base
            assert entry["owner"]["lease_remaining_seconds"] > 0
            skip = {"owner", "nbd_connections"}
            assert {k: v for k, v in entry.items() if k not in skip} == {
                k: v for k, v in shown[name].items() if k not in skip
            }
    assert listed["lb"]["state"] == "suspended"
    assert listed["lb"]["dispatch_mode"] == "bio"
    with http(second) as client:
        assert client.post("/v1/volumes/lb/resume").status_code == 200


def test_a_non_owner_redirects_the_data_path_to_the_owner(pair: tuple[Node, Node]) -> None:
    make_volume(pair[1], "r", "pr")  # placed on the least-loaded live node
    a, b = owner_and_other(pair, "r")
    data = pattern(4096, 8192)
    with http(b) as client:
        redirect = write(client, 4096, data, "r")
        assert redirect.status_code == 307
        assert redirect.headers["Location"] == f"{a.base}/v1/volumes/r/data"
        query = client.post("/v1/volumes/r/flush?x=1")
        assert query.headers["Location"] == f"{a.base}/v1/volumes/r/flush?x=1"
    with httpx.Client(base_url=b.base, headers=HEADERS, follow_redirects=True) as client:
        assert write(client, 4096, data, "r").status_code == 401  # the token stayed behind
    with http(b, follow=True) as client:
        write_flushed(client, 4096, data, "r")
        assert read(client, 4096, 8192, "r") == data
    with http(a) as client:
        assert read(client, 4096, 8192, "r") == data


def test_an_acknowledged_write_names_the_lease_epoch_it_was_accepted_under(
    pair: tuple[Node, Node],
) -> None:
    make_volume(pair[0], "e", "pe")
    a, _ = owner_and_other(pair, "e")
    shown = owner(a, "e")
    assert shown is not None
    with http(a) as client:
        answer = write(client, 0, pattern(0, 4096), "e")
    assert answer.status_code == 204
    assert answer.headers["Reqcrypt-Lease-Epoch"] == str(shown["lease_epoch"])


def raw_request(node: Node, head: str) -> tuple[int, bytes]:
    """One request sent as written (no client resolves its path first), its answer."""
    with socket.create_connection(("127.0.0.1", node.port), timeout=30) as sock:
        token = HEADERS["Authorization"]
        sock.sendall(f"{head}\r\nHost: x\r\nAuthorization: {token}\r\n\r\n".encode())
        status, _, body = read_response(sock)
    return status, body


def test_a_dot_segment_path_on_a_non_owner_is_refused_not_relayed(
    pair: tuple[Node, Node],
) -> None:
    make_volume(pair[0], "dots", "pdots")
    _, other = owner_and_other(pair, "dots")
    for path in ("/v1/volumes/dots/../dots/data", "/v1/volumes/dots/%2e%2e/dots/data"):
        status, body = raw_request(other, f"GET {path} HTTP/1.1")
        assert status == 400, body
        assert b"dot segments" in body


def test_a_body_on_a_non_data_path_of_a_remote_volume_is_bound_before_it_is_relayed(
    pair: tuple[Node, Node],
) -> None:
    make_volume(pair[0], "bound", "pbound")
    _, other = owner_and_other(pair, "bound")
    status, body = raw_request(
        other, f"PUT /v1/volumes/bound/x/data HTTP/1.1\r\nContent-Length: {512 << 20}"
    )
    assert status == 413
    assert b"REQCRYPT_MAX_CONTROL_BODY_BYTES" in body


def test_volumes_are_placed_on_the_least_loaded_node(pair: tuple[Node, Node]) -> None:
    loads = {node.node_id: node.metric("reqcrypt_node_volumes_owned") for node in pair}
    lightest = min(loads, key=lambda node: (loads[node], node))
    heaviest = next(node for node in pair if node.node_id != lightest)
    make_volume(heaviest, "p", "pp")
    shown = owner(heaviest, "p")
    assert shown is not None
    assert shown["node"] == lightest


def test_lifecycle_calls_on_a_non_owner_run_on_the_owner(pair: tuple[Node, Node]) -> None:
    make_volume(pair[0], "l", "pl")
    a, b = owner_and_other(pair, "l")
    with http(b) as via_b, http(a) as on_a:
        suspended = via_b.post("/v1/volumes/l/suspend")
        assert suspended.status_code == 200, suspended.text
        assert suspended.json()["owner"]["node"] == a.node_id
        assert on_a.get("/v1/volumes/l").json()["state"] == "suspended"
        patched = via_b.patch("/v1/volumes/l", json={"dispatch_mode": "bio"})
        assert patched.status_code == 200, patched.text
        assert on_a.get("/v1/volumes/l").json()["dispatch_mode"] == "bio"
        assert via_b.post("/v1/volumes/l/resume").status_code == 200
        assert on_a.get("/v1/volumes/l").json()["state"] == "active"
        missing = via_b.post("/v1/volumes/nope/suspend")
        assert missing.status_code == 404
        assert missing.headers["content-type"] == "application/problem+json"
        bad = via_b.patch("/v1/volumes/l", json={"dispatch_mode": "sideways"})
        assert bad.status_code == 422
        assert on_a.get("/v1/volumes/l").json()["dispatch_mode"] == "bio"
        anonymous = httpx.post(f"{b.base}/v1/volumes/l/suspend", timeout=10)
        assert anonymous.status_code == 401
        assert on_a.get("/v1/volumes/l").json()["state"] == "active"


def test_move_hands_a_volume_to_another_node(pair: tuple[Node, Node]) -> None:
    make_volume(pair[0], "m", "pm")
    a, b = owner_and_other(pair, "m")
    data = pattern(8192, 4096)
    with http(a) as client:
        assert write(client, 8192, data, "m").status_code == 204  # not flushed: moving does
        moved = client.post("/v1/volumes/m/move", json={"node": b.node_id})
        assert moved.status_code == 200, moved.text
        assert moved.json()["owner"]["node"] == b.node_id
        assert write(client, 0, data, "m").status_code == 307  # a no longer serves it
        unknown = client.post("/v1/volumes/m/move", json={"node": "zz"})
        assert unknown.status_code == 422  # forwarded to b, which knows no node zz
    with http(b) as client:
        assert read(client, 8192, 4096, "m") == data
    with http(b) as client:  # and back again, asked of the node that does not own it
        moved = client.post("/v1/volumes/m/move", json={"node": a.node_id})
        assert moved.status_code == 200, moved.text
        assert moved.json()["owner"]["node"] == a.node_id
        assert moved.json()["owner"]["lease_epoch"] == 3  # created 1, taken by b 2, by a 3
    with http(a) as client:
        assert read(client, 8192, 4096, "m") == data


def test_readiness_reports_the_database_and_the_node(pair: tuple[Node, Node]) -> None:
    answer = httpx.get(f"{pair[0].base}/readyz", timeout=10).json()
    assert answer["checks"]["database"] == "ok"
    assert answer["checks"]["node"] == "ok"


def test_the_cluster_metrics_named_in_operations_exist(pair: tuple[Node, Node]) -> None:
    make_volume(pair[0], "mx", "pmx")
    owner_node, _ = owner_and_other(pair, "mx")
    exported = httpx.get(f"{owner_node.base}/metrics", timeout=10).text
    operations = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    named = {
        name
        for name in re.findall(r"`(reqcrypt_[a-z_]+)`", operations)
        if CLUSTER_METRIC.match(name)
    }
    assert len(named) >= 8
    for metric in named:
        assert re.search(rf"^{metric}{{", exported, flags=re.MULTILINE), metric
    assert re.search(r'^reqcrypt_volume_lease_epoch{.*volume="mx"', exported, re.MULTILINE), (
        exported[-3000:]
    )


def test_a_stacked_volume_is_created_on_the_node_serving_its_lower_volume(
    pair: tuple[Node, Node],
) -> None:
    make_volume(pair[0], "sl", "psl")
    lower_owner, other = owner_and_other(pair, "sl")
    for via, name in ((other, "su1"), (lower_owner, "su2")):
        created = stack_on(via, name, "sl")
        assert created.status_code == 201, created.text
        assert created.json()["owner"]["node"] == lower_owner.node_id


def test_a_table_stacking_onto_another_nodes_volume_is_a_conflict(
    pair: tuple[Node, Node],
) -> None:
    make_volume(pair[0], "cl", "pcl")
    make_volume(pair[0], "co", "pco")
    lower_owner, other = owner_and_other(pair, "cl")
    with http(lower_owner) as client:
        moved = client.post("/v1/volumes/co/move", json={"node": other.node_id})
        assert moved.status_code == 200, moved.text
        table = "0 8 linear /dev/mapper/cl 0"
        loaded = client.put("/v1/volumes/co/table", content=table)
    assert loaded.status_code == 409, loaded.text
    assert loaded.headers["content-type"] == "application/problem+json"
    assert f"volume cl is served by node {lower_owner.node_id}" in loaded.json()["detail"]


def test_a_luks_header_changes_only_on_the_node_serving_a_volume_over_the_device(
    pair: tuple[Node, Node],
) -> None:
    """luksFormat, luksAddKey and luksKillSlot from a node that does not serve the volume
    mapping the device are refused (409); the serving node adds a key, and still refuses
    to format a device its volume maps; any node reads the dump, wherever the device was
    made."""
    cheap = {"type": "pbkdf2", "iterations": 1000}
    with http(pair[0]) as client:
        response = client.post("/v1/devices", json={"name": "plx", "size_bytes": 32 << 20})
        assert response.status_code == 201, response.text
        formatted = client.post("/v1/devices/plx/luks", json={"passphrase": "p", "pbkdf": cheap})
        assert formatted.status_code == 201, formatted.text
        created = client.post("/v1/volumes", json={"name": "lx", "table": "0 8 linear plx 0"})
        assert created.status_code == 201, created.text
    serving, other = owner_and_other(pair, "lx")
    add = {"passphrase": "p", "new_passphrase": "q", "pbkdf": cheap}
    with http(other) as client:
        assert client.get("/v1/devices/plx/luks").status_code == 200
        refused = [
            client.post("/v1/devices/plx/luks", json={"passphrase": "p", "pbkdf": cheap}),
            client.post("/v1/devices/plx/luks/keyslots", json=add),
            client.request("DELETE", "/v1/devices/plx/luks/keyslots/0", json={"force": True}),
        ]
    for response in refused:
        assert response.status_code == 409, response.text
        assert response.headers["content-type"] == "application/problem+json"
        assert (
            "mapped by volume(s) lx, served by another cluster node" in (response.json()["detail"])
        )
    with http(serving) as client:
        added = client.post("/v1/devices/plx/luks/keyslots", json=add)
        assert added.status_code == 201, added.text
        assert [slot["slot"] for slot in added.json()["dump"]["keyslots"]] == [0, 1]
        busy = client.post("/v1/devices/plx/luks", json={"passphrase": "p", "pbkdf": cheap})
        assert busy.status_code == 409
        assert "mapped by volume(s) lx" in busy.json()["detail"]


def test_a_stacked_volume_over_volumes_of_two_nodes_is_refused(pair: tuple[Node, Node]) -> None:
    make_volume(pair[0], "tl", "ptl")
    make_volume(pair[0], "to", "pto")
    first, other = owner_and_other(pair, "tl")
    with http(first) as client:
        moved = client.post("/v1/volumes/to/move", json={"node": other.node_id})
        assert moved.status_code == 200, moved.text
    table = "0 8 linear /dev/mapper/tl 0\n8 8 linear /dev/mapper/to 0"
    with http(first) as client:
        refused = client.post("/v1/volumes", json={"name": "tu", "table": table})
    assert refused.status_code == 409, refused.text
    assert "served by different nodes" in refused.json()["detail"]


def test_moving_a_lower_volume_moves_its_stack(pair: tuple[Node, Node]) -> None:
    make_volume(pair[0], "ml", "pml")
    assert stack_on(pair[0], "mu", "ml").status_code == 201
    source, target = owner_and_other(pair, "ml")
    lower_data, upper_data = pattern(0, 4096), pattern(4096, 4096)
    with http(source) as client:
        assert write(client, 0, lower_data, "ml").status_code == 204
        assert write(client, 0, upper_data, "mu").status_code == 204  # moving flushes
        moved = client.post("/v1/volumes/ml/move", json={"node": target.node_id})
        assert moved.status_code == 200, moved.text
    wait_owner(target, target.node_id, "mu")
    with http(target) as client:
        assert read(client, 0, 4096, "ml") == lower_data
        assert read(client, 0, 4096, "mu") == upper_data


@pytest.mark.slow
def test_a_killed_owner_fails_over_a_stack_with_flushed_data_intact(
    cluster: Callable[..., Node],
) -> None:
    """A 2-level stack (``up`` over half of ``lo``) on a, b started after: SIGKILL a and
    b takes both with both levels' flushed data, the lower volume first: each lease is
    taken once (epoch 2), never taken for an upper volume it cannot serve yet."""
    a = cluster("a")
    a.start()
    make_volume(a, "lo", "plo")
    assert stack_on(a, "up", "lo").status_code == 201
    b = cluster("b")
    b.start()
    lower_data, upper_data = pattern(0, 65536), pattern(65536, 65536)
    with http(a) as client:
        write_flushed(client, 0, lower_data, "lo")
        write_flushed(client, 0, upper_data, "up")
    a.kill()
    wait_owner(b, "b", "lo")
    wait_owner(b, "b", "up")
    with http(b) as client:
        assert read(client, 0, 65536, "lo") == lower_data
        assert read(client, 0, 65536, "up") == upper_data
    for name in ("lo", "up"):
        shown = owner(b, name)
        assert shown is not None
        assert shown["lease_epoch"] == 2, name


@pytest.mark.slow
def test_a_proxying_node_streams_the_data_path_to_the_owner(
    cluster: Callable[..., Node],
) -> None:
    """REQCRYPT_CLUSTER_DATA_PATH=proxy: a client that sends its token once and follows
    no redirect reads, writes and flushes through a node that does not own the volume,
    with the owner's Range, ETag and conditional answers."""
    a = cluster("a")
    a.start()
    make_volume(a)
    b = cluster("b", REQCRYPT_CLUSTER_DATA_PATH="proxy")
    b.start()
    data = pattern(4096, 262144)
    with http(b) as client:
        write_flushed(client, 4096, data)
        got = client.get("/v1/volumes/v/data", headers={"Range": "bytes=4096-266239"})
        assert got.status_code == 206
        assert got.headers["Content-Range"] == f"bytes 4096-266239/{SIZE}"
        assert got.content == data
        head = client.head("/v1/volumes/v/data")
        assert head.status_code == 200
        assert head.headers["Content-Length"] == str(SIZE)
        tag = head.headers["ETag"]
        assert client.head("/v1/volumes/v/data", headers={"If-None-Match": tag}).status_code == 304
        stale = client.put(
            "/v1/volumes/v/data",
            content=b"x" * 512,
            headers={"Content-Range": "bytes 0-511/*", "If-Match": '"stale"'},
        )
        assert stale.status_code == 412
    with http(a) as client:
        assert read(client, 4096, 262144) == data


@pytest.mark.slow
def test_a_proxied_read_of_a_frozen_owner_answers_503_within_about_a_lease(
    cluster: Callable[..., Node],
) -> None:
    """The proxy is bounded by the owner's heartbeat as a forwarded call is: a frozen owner
    costs the client about a lease, not the HTTP client's backstop."""
    a = cluster("a")
    a.start()
    make_volume(a)
    b = cluster("b", REQCRYPT_CLUSTER_DATA_PATH="proxy")
    b.start()
    a.signal(signal.SIGSTOP)
    started = time.monotonic()
    with http(b) as client:
        answer = client.get("/v1/volumes/v/data", headers={"Range": "bytes=0-4095"})
    assert_given_up_within_about_a_lease(answer, time.monotonic() - started)


def test_a_forwarded_request_reaching_a_non_owner_is_not_passed_on(
    pair: tuple[Node, Node],
) -> None:
    """The loop guard: a request another node forwarded or proxied here, for a volume this
    node does not serve (its owner changed on the way), answers 503, never hops again."""
    make_volume(pair[0], "f", "pf")
    _, other = owner_and_other(pair, "f")
    with http(other) as client:
        hopped = client.get(
            "/v1/volumes/f/data",
            headers={"Range": "bytes=0-511", "Reqcrypt-Forwarded-By": "elsewhere"},
        )
    assert hopped.status_code == 503, hopped.text
    assert hopped.headers["Retry-After"] == "1"
