"""Batched I/O over HTTP against single requests, ratios in one run (run with -m bench).

Random 4 KiB writes and reads on an aes-xts-plain64 volume (software engine, no
pacing): one I/O per request, and 64 per request (a multipart/byteranges PUT, a
64-range GET). wrk replays prebuilt requests, and its own CPU is checked, so the
rates are the server's.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
from pathlib import Path
from statistics import median

import httpx
import pytest

from tests.support.app import ADMIN_TOKEN
from tests.support.servers import Server

pytestmark = pytest.mark.bench
MIB = 1 << 20
SIZE = 256 * MIB
SCRIPT = Path(__file__).with_name("wrk_batch.lua")
DURATION_S = 3
ROUNDS = 3
BATCH = 64
CASES = {  # name: (method, I/Os per request, connections)
    "write 4 KiB x1": ("PUT", 1, 16),
    f"write 4 KiB x{BATCH}": ("PUT", BATCH, 4),
    "read 4 KiB x1": ("GET", 1, 16),
    f"read 4 KiB x{BATCH}": ("GET", BATCH, 4),
}
SPEEDUP_TARGET = 4.0
IOPS_TARGET = 15_000
CLIENT_CPU_LIMIT = 0.5
"""wrk may use at most half a core, or the ceiling would be the client's."""


def wrk(url: str, method: str, batch: int, connections: int) -> tuple[float, float]:
    """(requests per second, wrk's CPU seconds per wall second)."""
    env = {
        **os.environ,
        "TOKEN": ADMIN_TOKEN,
        "METHOD": method,
        "BS": "4096",
        "SIZE": str(SIZE),
        "BATCH": str(batch),
    }
    command = ["wrk", "-t1", f"-c{connections}", f"-d{DURATION_S}s", "-s", str(SCRIPT), url]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    output = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert "Non-2xx" not in output, output
    match = re.search(r"Requests/sec:\s+([0-9.]+)", output)
    assert match, output
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return float(match[1]), cpu / DURATION_S


def test_batches_multiply_the_4k_io_rate(tmp_path: Path) -> None:
    assert shutil.which("wrk"), "the batch benchmark needs wrk: apt-get install wrk"
    server = Server(tmp_path / "data", REQCRYPT_PLUG_WINDOW_US="0")
    server.start()
    iops: dict[str, list[float]] = {case: [] for case in CASES}
    client_cpu: dict[str, list[float]] = {case: [] for case in CASES}
    try:
        with httpx.Client(
            base_url=server.base, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60
        ) as client:
            client.post("/v1/devices", json={"name": "pv", "size_bytes": SIZE})
            key = bytes(range(64)).hex()
            table = f"0 {SIZE // 512} crypt aes-xts-plain64 {key} 0 pv 0"
            assert client.post("/v1/volumes", json={"name": "xts", "table": table}).is_success
            chunk = bytes(MIB)
            for offset in range(0, SIZE, MIB):  # allocate the sparse file's blocks first
                headers = {"Content-Range": f"bytes {offset}-{offset + MIB - 1}/*"}
                client.put("/v1/volumes/xts/data", content=chunk, headers=headers)
        url = server.base + "/v1/volumes/xts/data"
        order = list(CASES)
        for _ in range(ROUNDS):
            for case in order:
                method, batch, connections = CASES[case]
                rate, cpu = wrk(url, method, batch, connections)
                iops[case].append(rate * batch)
                client_cpu[case].append(cpu)
            order = order[1:] + order[:1]
    finally:
        server.stop()
    print()
    print(f"{'case':16} {'4 KiB I/Os/s':>13} {'range':>17} {'wrk CPU':>8}")
    for case, rates in iops.items():
        print(
            f"{case:16} {median(rates):13.0f} {min(rates):8.0f}-{max(rates):<8.0f} "
            f"{median(client_cpu[case]):7.0%}"
        )
    misses = []
    for op in ("write", "read"):
        single, batched = iops[f"{op} 4 KiB x1"], iops[f"{op} 4 KiB x{BATCH}"]
        ratios = sorted(b / s for b, s in zip(batched, single, strict=True))
        print(f"{op}: batch/single {median(ratios):.1f}x ({ratios[0]:.1f}-{ratios[-1]:.1f})")
        if median(ratios) < SPEEDUP_TARGET:
            misses.append(f"{op}: batches {median(ratios):.1f}x single (target {SPEEDUP_TARGET}x)")
        if median(batched) < IOPS_TARGET:
            misses.append(f"{op}: {median(batched):.0f} I/Os/s batched (target {IOPS_TARGET})")
    for case, cpu in client_cpu.items():
        if median(cpu) > CLIENT_CPU_LIMIT:
            misses.append(f"{case}: wrk used {median(cpu):.0%} of a core: the client bounds it")
    assert misses == []
