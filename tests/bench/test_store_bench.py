"""A merged request's write through ``FileStore.writev`` against one buffer's ``write``.

Run on demand: ``.venv/bin/pytest -m bench -s tests/bench/test_store_bench.py``.
1 MiB overwrites of a file in the page cache, cut into segments as the crypt target
cuts its output (slices of one buffer) or scattered (every other slice of a buffer
twice the size); CPU per MiB (this thread: Python, the native loop and the kernel),
rounds interleaved, medians. What segments cost on top of the system calls.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median

import pytest

from app.storage.file import FileStore

pytestmark = pytest.mark.bench

MIB = 1 << 20
FILE_MIB = 16
ROUNDS = 15


def cpu_us_per_mib(write: Callable[[int], None], calls: int = FILE_MIB) -> float:
    start = time.thread_time_ns()
    for index in range(calls):
        write(index * MIB)
    return (time.thread_time_ns() - start) / calls / 1000


def test_writev_costs_little_more_than_one_write(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "dev.img", FILE_MIB * MIB, create=True)
    pool = memoryview(bytearray(os.urandom(2 * MIB)))
    whole = pool[:MIB]
    for offset in range(0, FILE_MIB * MIB, MIB):
        store.write(offset, whole)
    print(f"\n1 MiB writes, CPU µs per MiB (median of {ROUNDS} interleaved rounds)")
    print(f"{'segments':<22}{'write':>8}{'writev':>8}{'ratio':>7}")
    for segment in (4096, 65536, 262144):
        for layout, step in (("adjacent", segment), ("scattered", 2 * segment)):
            segments = [
                pool[start : start + segment] for start in range(0, MIB // segment * step, step)
            ]
            one: list[float] = []
            many: list[float] = []
            for _ in range(ROUNDS):
                one.append(cpu_us_per_mib(lambda offset: store.write(offset, whole)))
                many.append(cpu_us_per_mib(lambda offset: store.writev(offset, segments)))  # noqa: B023
            ratio = median(m / o for m, o in zip(many, one, strict=True))
            name = f"{MIB // segment} x {segment >> 10} KiB {layout}"
            print(f"{name:<22}{median(one):>8.1f}{median(many):>8.1f}{ratio:>6.2f}x")
    store.close()
