"""Requests wait for the device, and merge while they wait (run with -m bench).

16 concurrent HTTP writers (wrk connections) of interleaved adjacent 4 KiB blocks
(each writes the next block of one shared sequence) on an sdcard-bbb device (one
hardware tag) with the omap-aes-am335x engine, pacing on: the device really takes
its modelled time, so while one request is on it the others queue in the
elevator, where adjacent bios merge. Request mode against bio mode, same run.

With N synchronous writers and one tag, requests alternate between two groups
(one on the device, the other queued), so merging alone tends to N/2 bios per
request: 32 KiB here, measured 30-31 KiB with the default 50 us plug window. A
plug window as long as the writers take to resubmit (5 ms: the card's write
latency is 2.8 ms) gathers them into one request; the targets apply to it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.app import ADMIN_TOKEN
from tests.support.servers import Server

pytestmark = pytest.mark.bench
WRITERS = 16
DURATION_S = 3
SIZE = 64 << 20
KEY = bytes(range(32)).hex()
SCRIPT = Path(__file__).with_name("wrk_interleaved.lua")
CONFIGS = {  # volume: (dispatch mode, plug window in us)
    "bio": ("bio", 50),
    "request": ("request", 50),
    "request-5ms": ("request", 5000),
}


def run_writers(url: str) -> int:
    """Writes wrk saw completed, each of the next block of the sequence."""
    env = {**os.environ, "TOKEN": ADMIN_TOKEN, "BLOCKS": str(SIZE // 4096)}
    command = ["wrk", "-t1", f"-c{WRITERS}", f"-d{DURATION_S}s", "-s", str(SCRIPT), url]
    output = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    assert "Non-2xx" not in output, output
    match = re.search(r"(\d+) requests in", output)
    assert match, output
    return int(match[1])


def test_request_mode_merges_concurrent_writers_at_queue_depth_1(tmp_path: Path) -> None:
    assert shutil.which("wrk"), "the merge benchmark needs wrk: apt-get install wrk"
    server = Server(tmp_path / "data", REQCRYPT_PACING="1")
    server.start()
    figures: dict[str, dict[str, float]] = {}
    try:
        with server.client() as client:
            for name, (mode, plug_window_us) in CONFIGS.items():
                device = f"mmc-{name}"
                response = client.post(
                    "/v1/devices", json={"name": device, "size_bytes": SIZE, "model": "sdcard-bbb"}
                )
                assert response.status_code == 201, response.text
                table = f"0 {SIZE // 512} crypt aes-cbc-plain64 {KEY} 0 {device} 0"
                response = client.post(
                    "/v1/volumes",
                    json={
                        "name": name,
                        "table": table,
                        "engine": "omap-aes-am335x",
                        "dispatch_mode": mode,
                        "plug_window_us": plug_window_us,
                    },
                )
                assert response.status_code == 201, response.text
                assert response.json()["queue_depth"] == 1
                written = run_writers(f"{server.base}/v1/volumes/{name}/data")
                figures[name] = client.get(f"/v1/volumes/{name}/status").json()["stats"]
                figures[name]["written"] = written
                checked = written + WRITERS + 1  # wrk's count misses requests still in flight
                data = client.get(
                    f"/v1/volumes/{name}/data", headers={"Range": f"bytes=0-{checked * 4096 - 1}"}
                ).content
                intact = 0
                for block in range(checked):
                    content = data[block * 4096 : (block + 1) * 4096]
                    if content == f"{block:08d}".encode() * 512:
                        intact += 1
                    else:  # never written, or torn / misplaced: only the first may be
                        assert not content[:8].isdigit(), (name, block, content[:16])
                assert intact >= written, (name, intact, written)
    finally:
        server.stop()
    print()
    print(
        f"{'volume':12} {'bios':>5} {'requests':>8} {'wareq_sz':>9} {'engine calls':>12} "
        f"{'aqu_sz':>7}"
    )
    for name, stats in figures.items():
        print(
            f"{name:12} {stats['w_bios']:5} {stats['w_ios']:8} {stats['wareq_sz']:8.1f}K "
            f"{stats['engine_calls']:12} {stats['aqu_sz']:7.1f}"
        )
    calls_per_bio = {name: f["engine_calls"] / f["w_bios"] for name, f in figures.items()}
    for name in CONFIGS:
        print(
            f"{name}: {calls_per_bio[name]:.3f} engine calls per bio, request sizes "
            f"(KiB bucket: count) {figures[name]['request_size_histogram']}"
        )
    merged = figures["request-5ms"]
    assert merged["wareq_sz"] >= 32, merged
    assert calls_per_bio["request-5ms"] * 8 <= calls_per_bio["bio"], calls_per_bio
