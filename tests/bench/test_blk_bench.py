"""Scheduler benchmark: merging under concurrency and the queue's own cost per bio.

Run on demand: ``.venv/bin/pytest -m bench tests/bench/test_blk_bench.py -s``.
The engine is a no-op that counts one call per dispatched request, so in
``bio`` mode it counts one per bio.
"""

from __future__ import annotations

import threading
import time

import pytest

from app.blk import Bio, BlockQueue, Op, QueueLimits, Request

pytestmark = pytest.mark.bench

CLIENTS = 16
BIOS_PER_CLIENT = 512
DEPTH = 32
BLOCK = 4096
SECTORS = BLOCK // 512


def make_queue(mode: str) -> BlockQueue:
    holder: list[BlockQueue] = []

    def dispatch(rq: Request) -> None:
        holder[0].stats.add_engine_calls(1)

    queue = BlockQueue(dispatch, limits=QueueLimits(), dispatch_mode=mode)  # type: ignore[arg-type]
    holder.append(queue)
    return queue


def concurrent_run(
    mode: str, depth: int = DEPTH, per_client: int = BIOS_PER_CLIENT
) -> dict[str, float]:
    queue = make_queue(mode)
    payload = memoryview(bytes(BLOCK))
    bios = [
        [
            Bio(Op.WRITE, (client * per_client + index) * SECTORS, SECTORS, [payload])
            for index in range(per_client)
        ]
        for client in range(CLIENTS)
    ]
    start_line = threading.Barrier(CLIENTS + 1)

    def client(own: list[Bio]) -> None:
        start_line.wait()
        pending: list[Bio] = []
        for bio in own:
            queue.submit_bio(bio)
            pending.append(bio)
            if len(pending) >= depth:
                pending.pop(0).wait(30)
        for bio in pending:
            bio.wait(30)

    threads = [threading.Thread(target=client, args=(own,)) for own in bios]
    for thread in threads:
        thread.start()
    start_line.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    stats = queue.stats.snapshot()
    total = CLIENTS * per_client
    return {
        "bios": total,
        "requests": stats["w_ios"],
        "engine_calls": stats["engine_calls"],
        "avg_kib": stats["wareq_sz"],
        "us_per_bio": elapsed / total * 1e6,
    }


def single_thread_run(bios_count: int = 50_000) -> dict[str, float]:
    queue = make_queue("request")
    payload = memoryview(bytes(BLOCK))
    bios = [Bio(Op.WRITE, index * SECTORS, SECTORS, [payload]) for index in range(bios_count)]
    began = time.perf_counter()
    for bio in bios:
        queue.submit_bio(bio)
    queue.finish_plug()
    for bio in bios:
        bio.wait(30)
    elapsed = time.perf_counter() - began
    stats = queue.stats.snapshot()
    return {
        "bios": bios_count,
        "requests": stats["w_ios"],
        "engine_calls": stats["engine_calls"],
        "avg_kib": stats["wareq_sz"],
        "us_per_bio": elapsed / bios_count * 1e6,
    }


def test_request_mode_merges_and_stays_cheap():
    results = {
        "request x16": concurrent_run("request"),
        "bio x16": concurrent_run("bio"),
        "request x1": single_thread_run(),
        "request qd1": concurrent_run("request", depth=1, per_client=128),
        "bio qd1": concurrent_run("bio", depth=1, per_client=128),
    }
    print()
    print(f"{'run':<12} {'bios':>7} {'requests':>9} {'engine':>7} {'avg KiB':>8} {'us/bio':>7}")
    for name, row in results.items():
        print(
            f"{name:<12} {row['bios']:>7} {row['requests']:>9} {row['engine_calls']:>7}"
            f" {row['avg_kib']:>8.1f} {row['us_per_bio']:>7.2f}"
        )
    merged, alone, single = results["request x16"], results["bio x16"], results["request x1"]
    assert merged["avg_kib"] >= 64
    assert merged["engine_calls"] * 16 <= alone["engine_calls"]
    assert single["us_per_bio"] < 20


def _batches_per_second(queue: BlockQueue, rounds: int = 400) -> float:
    payload = memoryview(bytes(BLOCK))
    began = time.perf_counter()
    for round_ in range(rounds):
        bios = [Bio(Op.WRITE, (round_ * 64 + i) * SECTORS, SECTORS, [payload]) for i in range(64)]
        queue.submit_bios(bios)
        for bio in bios:
            bio.wait(30)
    return rounds / (time.perf_counter() - began)


def test_trace_hooks_cost_nothing_without_a_listener() -> None:
    """A queue whose listener left runs as fast as one that never had a listener (rounds
    interleaved, best of each, against a noisy machine); while listening it does more."""
    fresh = make_queue("request")
    listened = make_queue("request")
    listener = listened.listen(capacity=1 << 20)
    traced = max(_batches_per_second(listened) for _ in range(3))
    listened.unlisten(listener)
    listener.drain()  # the events it held would otherwise weigh on every GC pass
    untraced = after = 0.0
    for _ in range(5):
        untraced = max(untraced, _batches_per_second(fresh))
        after = max(after, _batches_per_second(listened))
    print(
        f"\nbatches of 64 bios/s: never listened {untraced:.0f}, listening {traced:.0f}, "
        f"after the listener left {after:.0f}"
    )
    assert after >= 0.9 * untraced
    assert traced < untraced
