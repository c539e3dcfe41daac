"""Crash consistency: SIGKILL the real service mid-I/O and mid-lifecycle, restart, verify.

Each run is seeded. Per kill cycle, writers rewrite their own 4 KiB blocks with
unique contents and record which writes were acknowledged; a flusher records when
each completed flush had started; a lifecycle thread creates and removes a volume,
swaps a table, or wipes and sets a key, or a benchmark job runs. The process is
killed at a random moment, restarted, and then:

- the service starts and every volume it lists is whole and usable;
- every 512-byte data unit of every block holds that unit of the last write
  acknowledged before a completed flush, or of a write issued after it: never
  older data, never bytes no write carried (a torn unit decrypts to garbage);
- a volume created or removed around the kill exists whole or not at all.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.support.keys import CBC_KEY, XTS_KEY
from tests.support.servers import Server

pytestmark = pytest.mark.e2e
KILLS = 20
WRITERS = 4
BLOCKS_PER_WRITER = 8
ACKS_BEFORE_KILL = 10
BLOCK = 4096
UNIT = 512
SIZE = 4 << 20


@dataclass
class BlockHistory:
    """What may be on disk for one block: the durable content, then every later write."""

    candidates: list[bytes]
    durable: int = 0  # index into candidates of the newest write known durable
    acked_at: dict[int, float] = field(default_factory=dict)


def content(seed: int, kill: int, writer: int, seq: int, block: int) -> bytes:
    stamp = f"s{seed} k{kill} w{writer} n{seq} b{block};".encode()
    return (stamp * (BLOCK // len(stamp) + 1))[:BLOCK]


def read_block(client: httpx.Client, block: int) -> bytes:
    first = block * BLOCK
    response = client.get(
        "/v1/volumes/v/data", headers={"Range": f"bytes={first}-{first + BLOCK - 1}"}
    )
    assert response.status_code == 206, response.text
    return response.content


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    env = {}
    if request.param == "postgres":
        env["REQCRYPT_DATABASE_URL"] = request.getfixturevalue("postgres_url")
    running = Server(tmp_path / "data", **env)
    running.start()
    try:
        yield running
    finally:
        if running.process is not None:
            running.stop()


def lifecycle(client: httpx.Client, rng: random.Random, kill: int, stop: threading.Event) -> None:
    """One of the lifecycle operations the kill may land in, repeated until stopped."""
    action = rng.choice(["create-remove", "table-swap", "key-message", "benchmark"])
    n = 0
    while not stop.is_set():
        n += 1
        name = f"tmp{kill}x{n}"
        try:
            if action == "create-remove":
                client.post("/v1/devices", json={"name": name, "size_bytes": 1 << 20})
                client.post("/v1/volumes", json={"name": name, "table": f"0 2048 linear {name} 0"})
                client.delete(f"/v1/volumes/{name}")
                client.delete(f"/v1/devices/{name}")
            elif action == "table-swap":
                length = rng.choice([1024, 2048])
                table = f"0 {length} crypt aes-xts-plain64 {XTS_KEY} 0 pv2 0"
                client.put("/v1/volumes/swap/table", json={"table": table})
                client.post("/v1/volumes/swap/resume")
            elif action == "key-message":
                client.post("/v1/volumes/keyed/suspend", json={})
                client.post("/v1/volumes/keyed/message", json={"message": "key wipe"})
                client.post("/v1/volumes/keyed/message", json={"message": f"key set {CBC_KEY}"})
                client.post("/v1/volumes/keyed/resume")
            else:
                template = {
                    "table": f"0 2048 crypt aes-xts-plain64 {XTS_KEY} 0 {{dev}} 0",
                    "device_size": "1M",
                }
                client.post(
                    "/v1/benchmarks",
                    json={"volume_template": template, "workload": {"rw": "write", "size": "1M"}},
                )
                stop.wait()
        except httpx.HTTPError:
            return  # the kill landed


def run_until_killed(
    server: Server, histories: dict[int, BlockHistory], seed: int, kill: int, rng: random.Random
) -> int:
    """Returns how many writes were acknowledged before the kill."""
    stop = threading.Event()
    under_way = threading.Event()
    lock = threading.Lock()
    flush_started: list[float] = []
    acked_this_run = 0

    def writer(index: int) -> None:
        nonlocal acked_this_run
        blocks = range(index * BLOCKS_PER_WRITER, (index + 1) * BLOCKS_PER_WRITER)
        with server.client() as client:
            seq = 0
            while not stop.is_set():
                seq += 1
                block = blocks[seq % len(blocks)]
                data = content(seed, kill, index, seq, block)
                history = histories[block]
                with lock:
                    history.candidates.append(data)
                    position = len(history.candidates) - 1
                try:
                    first = block * BLOCK
                    response = client.put(
                        "/v1/volumes/v/data",
                        content=data,
                        headers={"Content-Range": f"bytes {first}-{first + BLOCK - 1}/*"},
                    )
                except httpx.HTTPError:
                    return
                if response.status_code == 204:
                    with lock:
                        history.acked_at[position] = time.monotonic()
                        acked_this_run += 1
                        if acked_this_run >= ACKS_BEFORE_KILL:
                            under_way.set()

    def flusher() -> None:
        with server.client() as client:
            while not stop.is_set():
                began = time.monotonic()
                try:
                    response = client.post("/v1/volumes/v/flush")
                except httpx.HTTPError:
                    return
                if response.status_code == 204:
                    with lock:
                        flush_started.append(began)
                time.sleep(0.01)

    def lifecycle_thread() -> None:
        with server.client() as client:
            lifecycle(client, rng, kill, stop)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
    threads += [threading.Thread(target=flusher), threading.Thread(target=lifecycle_thread)]
    for thread in threads:
        thread.start()
    # On a loaded machine the first writes can take seconds: the kill waits for real I/O.
    under_way.wait(60)
    time.sleep(rng.uniform(0.1, 0.6))
    server.stop(sig=9)
    stop.set()
    for thread in threads:
        thread.join(30)
    acknowledged = sum(len(history.acked_at) for history in histories.values())
    last_flush = max(flush_started, default=None)
    if last_flush is not None:
        for history in histories.values():
            durable = [i for i, at in history.acked_at.items() if at <= last_flush]
            if durable:
                history.durable = max(history.durable, max(durable))
    return acknowledged


def verify(client: httpx.Client, histories: dict[int, BlockHistory], kill: int) -> None:
    for block, history in histories.items():
        data = read_block(client, block)
        allowed = history.candidates[history.durable :]
        for unit in range(0, BLOCK, UNIT):
            piece = data[unit : unit + UNIT]
            assert any(c[unit : unit + UNIT] == piece for c in allowed), (
                f"kill {kill}: block {block} unit {unit // UNIT} holds neither its last durable "
                f"write nor a later one"
            )
        # What is on disk now is the baseline for the next cycle, once flushed.
        history.candidates, history.durable, history.acked_at = [data], 0, {}
    assert client.post("/v1/volumes/v/flush").status_code == 204
    volumes = {v["name"]: v for v in client.get("/v1/volumes").json()}
    assert {"v", "swap", "keyed"} <= set(volumes)
    devices = {d["name"] for d in client.get("/v1/devices").json()}
    for name, info in volumes.items():
        if name.startswith(("tmp", "bench-")):
            assert name in devices, f"kill {kill}: volume {name} without its device"
            assert client.delete(f"/v1/volumes/{name}").status_code == 204, name
            continue
        if info["state"] == "suspended":
            if name == "keyed":
                client.post("/v1/volumes/keyed/message", json={"message": f"key set {CBC_KEY}"})
            assert client.post(f"/v1/volumes/{name}/resume").status_code == 200, name
    for name in devices:
        if name.startswith(("tmp", "bench-")):
            assert client.delete(f"/v1/devices/{name}").status_code == 204, name
    for run in client.get("/v1/benchmarks").json():
        assert run["state"] in ("done", "failed"), run


@pytest.mark.slow
def test_sigkill_at_random_points_loses_no_flushed_write(server: Server) -> None:
    seed = 1
    rng = random.Random(seed)
    with server.client() as client:
        for name in ("pv", "pv2", "pv3"):
            assert client.post("/v1/devices", json={"name": name, "size_bytes": SIZE}).is_success
        volumes = {
            "v": f"0 {SIZE // 512} crypt aes-xts-plain64 {XTS_KEY} 0 pv 0",
            "swap": f"0 2048 crypt aes-xts-plain64 {XTS_KEY} 0 pv2 0",
            "keyed": f"0 2048 crypt aes-cbc-essiv:sha256 {CBC_KEY} 0 pv3 0",
        }
        for name, table in volumes.items():
            assert client.post("/v1/volumes", json={"name": name, "table": table}).is_success
        histories = {
            block: BlockHistory([read_block(client, block)])
            for block in range(WRITERS * BLOCKS_PER_WRITER)
        }
        assert client.post("/v1/volumes/v/flush").status_code == 204
    acknowledged = 0
    for kill in range(KILLS):
        acknowledged += run_until_killed(server, histories, seed, kill, rng)
        server.start()
        with server.client() as client:
            verify(client, histories, kill)
    assert acknowledged >= 10 * KILLS  # the kills landed among real I/O
