"""HTTP data path throughput against the HTTP ceiling, ratios in one run (run with -m bench).

Sequential 1 MiB writes/reads over a 256 MiB volume and 4 KiB random I/O, on an
aes-xts-plain64 volume, a linear volume and the bare ``/v1/null/data`` endpoint
of the same app. Clients are ``http.client`` keep-alive connections in threads
(lighter than httpx, which saturates before the server).
"""

from __future__ import annotations

import http.client
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN
from tests.integration.test_e2e_data import Server

pytestmark = pytest.mark.bench
MIB = 1 << 20
SIZE = 256 * MIB
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def run_clients(port: int, jobs: list[tuple[str, str, int, int]], clients: int) -> float:
    """Run (method, path, offset, length) jobs over ``clients`` keep-alive connections."""
    lock = threading.Lock()
    pending = list(reversed(jobs))
    payload = bytes(max(length for *_, length in jobs))

    def worker() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port)
        while True:
            with lock:
                if not pending:
                    break
                method, path, offset, length = pending.pop()
            last = offset + length - 1
            if method == "PUT":
                headers = {**AUTH, "Content-Range": f"bytes {offset}-{last}/*"}
                connection.request("PUT", path, body=payload[:length], headers=headers)
            else:
                connection.request("GET", path, headers={**AUTH, "Range": f"bytes={offset}-{last}"})
            response = connection.getresponse()
            response.read()
            assert response.status in (204, 206), response.status
        connection.close()

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def test_http_data_path_against_the_http_ceiling(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", REQCRYPT_PLUG_WINDOW_US="0")
    server.start()
    try:
        with httpx.Client(base_url=server.base, headers=AUTH) as client:
            for name in ("pv1", "pv2"):
                client.post("/v1/devices", json={"name": name, "size_bytes": SIZE})
            key = bytes(range(64)).hex()
            xts = f"0 {SIZE // 512} crypt aes-xts-plain64 {key} 0 pv1 0"
            client.post("/v1/volumes", json={"name": "xts", "table": xts})
            client.post(
                "/v1/volumes", json={"name": "lin", "table": f"0 {SIZE // 512} linear pv2 0"}
            )
        paths = {
            "xts": "/v1/volumes/xts/data",
            "linear": "/v1/volumes/lin/data",
            "null": "/v1/null/data",
        }
        rng = random.Random(1)
        random_offsets = [rng.randrange(0, SIZE // 4096) * 4096 for _ in range(4000)]
        workloads: dict[str, Callable[[str], list[tuple[str, str, int, int]]]] = {
            "seq write 1 MiB": lambda p: [("PUT", p, o, MIB) for o in range(0, SIZE, MIB)],
            "seq read 1 MiB": lambda p: [("GET", p, o, MIB) for o in range(0, SIZE, MIB)],
            "rand write 4 KiB": lambda p: [("PUT", p, o, 4096) for o in random_offsets],
            "rand read 4 KiB": lambda p: [("GET", p, o, 4096) for o in random_offsets],
        }
        results: dict[tuple[str, str], float] = {}
        for workload, jobs_for in workloads.items():
            clients = 2 if "1 MiB" in workload else 4
            for _round in range(3):
                for target, path in paths.items():
                    jobs = jobs_for(path)
                    seconds = run_clients(server.port, jobs, clients)
                    rate = len(jobs) / seconds
                    key2 = (workload, target)
                    results[key2] = max(results.get(key2, 0.0), rate)
    finally:
        server.stop()
    print()
    print(f"{'workload':18} {'target':7} {'ops/s':>9} {'MB/s':>8} {'vs ceiling':>10}")
    for (workload, target), rate in results.items():
        size = MIB if "1 MiB" in workload else 4096
        ceiling = results[(workload, "null")]
        print(
            f"{workload:18} {target:7} {rate:9.0f} {rate * size / 1e6:8.1f} {rate / ceiling:10.0%}"
        )
    for workload in workloads:
        ratio = results[(workload, "xts")] / results[(workload, "null")]
        target_ratio = 0.70 if "1 MiB" in workload else 0.60
        assert ratio >= target_ratio, f"{workload}: xts at {ratio:.0%} of the HTTP ceiling"
