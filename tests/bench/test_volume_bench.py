"""Merging through a whole volume (crypt target, software engine), bio vs request mode.

Run on demand: ``.venv/bin/pytest -m bench -s tests/bench/test_volume_bench.py``.
16 clients, each with 2 writes in flight (fio's iodepth=2: one thread per slot),
write sequential 4 KiB blocks striped so that, at each step, all 32 blocks are
adjacent (slot s writes block k*32 + s): what a request-based queue can merge
and a bio-based one cannot.
"""

from __future__ import annotations

import threading

import pytest

from app.blk.tuning import Tuning
from app.dm.table import parse_table
from app.dm.volume import Volume
from app.engine.registry import EngineRegistry
from app.storage.memory import MemoryStore
from tests.support.keys import XTS_KEY

pytestmark = pytest.mark.bench

CLIENTS = 16
DEPTH = 2
SLOTS = CLIENTS * DEPTH
STEPS = 128
BLOCK = 4096
PLUG_WINDOW_US = 5000
"""Long enough to collect one write from each of the 32 slots under the GIL: measured,
3000 us merged to 54-126 KiB from run to run, 5000 us to 128 KiB (the plug's flush
size) every time, at 5 ms w_await: the plug window trades latency for merging."""


def run(mode: str) -> dict[str, float]:
    size = SLOTS * STEPS * BLOCK
    store = MemoryStore(size)
    volume = Volume(
        "bench",
        "uuid",
        engine=EngineRegistry().engine("software"),
        tuning=Tuning(dispatch_mode=mode, plug_window_us=PLUG_WINDOW_US),  # type: ignore[arg-type]
    )
    volume.load(parse_table(f"0 {size // 512} crypt aes-xts-plain64 {XTS_KEY} 0 pv 0"))
    volume.resume(lambda ref: store)
    barrier = threading.Barrier(SLOTS)
    payload = bytes(BLOCK)

    def slot(index: int) -> None:
        barrier.wait()
        for step in range(STEPS):
            volume.write((step * SLOTS + index) * BLOCK, payload)

    threads = [threading.Thread(target=slot, args=(i,)) for i in range(SLOTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = volume.stats.snapshot()
    volume.remove()
    return stats


def test_request_mode_merges_striped_concurrent_writers() -> None:
    bio, request = run("bio"), run("request")
    print()
    print(
        f"{'mode':8} {'bios':>6} {'requests':>8} {'avg KiB':>8} {'engine calls':>12} {'w_await ms':>10}"
    )
    for name, stats in (("bio", bio), ("request", request)):
        print(
            f"{name:8} {stats['w_bios']:6} {stats['w_ios']:8} {stats['wareq_sz']:8.1f} "
            f"{stats['engine_calls']:12} {stats['w_await']:10.3f}"
        )
    assert request["wareq_sz"] >= 64
    assert request["engine_calls"] * 16 <= bio["engine_calls"]
