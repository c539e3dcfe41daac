"""The data path's thread pool: results, errors, concurrency and shutdown."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import weakref

import anyio
import numpy as np
import pytest

from app.io.executor import IoExecutor

pytestmark = pytest.mark.anyio


async def test_results_and_errors_come_back_to_the_awaiting_task() -> None:
    executor = IoExecutor()
    assert await executor.run(sum, [1, 2, 3]) == 6
    with pytest.raises(ZeroDivisionError):
        await executor.run(lambda: 1 / 0)
    executor.shutdown()


async def test_blocking_jobs_do_not_hold_up_the_others() -> None:
    executor = IoExecutor()
    release = threading.Event()
    results: list[str] = []

    async def blocked() -> None:
        results.append(await executor.run(lambda: release.wait(5) and "blocked"))

    async with anyio.create_task_group() as group:
        group.start_soon(blocked)
        await anyio.sleep(0.01)
        results.append(await executor.run(lambda: "quick"))
        release.set()
    assert results == ["quick", "blocked"]
    executor.shutdown()


async def test_a_shut_down_executor_refuses_work() -> None:
    executor = IoExecutor()
    executor.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        await executor.run(lambda: None)


async def test_many_concurrent_jobs_all_complete() -> None:
    executor = IoExecutor(max_workers=4)
    results: list[int] = []

    async def one(value: int) -> None:
        results.append(await executor.run(lambda: value))

    async with anyio.create_task_group() as group:
        for value in range(500):
            group.start_soon(one, value)
    assert sorted(results) == list(range(500))
    executor.shutdown()


async def test_one_job_at_a_time_keeps_running_on_the_same_thread() -> None:
    executor = IoExecutor()
    threads = set()
    for _ in range(20):
        threads.add(await executor.run(threading.get_ident))
        await anyio.sleep(0.001)
    assert len(threads) == 1
    executor.shutdown()


async def test_the_last_idle_thread_is_the_first_woken() -> None:
    executor = IoExecutor()
    release = threading.Event()

    async def blocked() -> None:
        await executor.run(release.wait, 5)

    async with anyio.create_task_group() as group:
        for _ in range(3):
            group.start_soon(blocked)
        await anyio.sleep(0.05)
        release.set()
    await anyio.sleep(0.05)
    first = await executor.run(threading.get_ident)
    await anyio.sleep(0.01)
    assert await executor.run(threading.get_ident) == first
    executor.shutdown()


async def test_submit_hands_the_result_to_done_callbacks_on_the_loop() -> None:
    executor = IoExecutor()
    loop_thread = threading.get_ident()
    seen: list[tuple[int, int]] = []
    future = executor.submit(sum, [1, 2, 3])
    future.add_done_callback(lambda done: seen.append((done.result(), threading.get_ident())))
    failed = executor.submit(lambda: 1 / 0)
    assert await future == 6
    with pytest.raises(ZeroDivisionError):
        await failed
    await anyio.sleep(0)
    assert seen == [(6, loop_thread)]
    executor.shutdown()


def test_every_job_of_many_submitters_is_delivered_on_uvloop_too() -> None:
    """Production runs uvloop: jobs of uneven length from many tasks on few and on many
    workers, each result reaching its own awaiting task."""
    uvloop = pytest.importorskip("uvloop")

    async def many(max_workers: int) -> None:
        executor = IoExecutor(max_workers=max_workers)
        results: list[tuple[int, int]] = []

        def job(task: int, step: int) -> tuple[int, int]:
            if (task + step) % 7 == 0:
                time.sleep(0.0005)
            return task, step

        async def one(task: int) -> None:
            for step in range(40):
                results.append(await executor.run(job, task, step))

        async with anyio.create_task_group() as group:
            for task in range(50):
                group.start_soon(one, task)
        assert sorted(results) == [(task, step) for task in range(50) for step in range(40)]
        executor.shutdown()

    for max_workers in (1, 3, 64):
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(many(max_workers))


async def test_jobs_running_at_shutdown_are_still_delivered_then_the_eventfd_closes() -> None:
    executor = IoExecutor()
    release = threading.Event()
    futures = [executor.submit(release.wait, 5) for _ in range(3)]
    await anyio.sleep(0.01)
    wakeup = executor._wakeup
    executor.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        executor.submit(lambda: None)
    release.set()
    with anyio.fail_after(5):
        assert [await future for future in futures] == [True, True, True]
        while _is_open(wakeup):
            await anyio.sleep(0.001)


async def test_idle_workers_end_at_shutdown_and_the_eventfd_closes_after_them() -> None:
    executor = IoExecutor()
    await executor.run(lambda: None)
    wakeup = executor._wakeup
    executor.shutdown()
    with anyio.fail_after(5):
        while _is_open(wakeup):
            await anyio.sleep(0.001)
    assert executor._workers == 0
    executor.shutdown()


def test_an_executor_that_never_ran_a_job_closes_its_eventfd_at_shutdown() -> None:
    executor = IoExecutor()
    executor.shutdown()
    assert not _is_open(executor._wakeup)


def test_a_new_event_loop_takes_over_deliveries_from_a_closed_one() -> None:
    """An app outlives the loop it first ran in (tests, ``TestClient`` without a block)."""
    executor = IoExecutor()
    for _ in range(3):
        with asyncio.Runner() as runner:
            assert runner.run(executor.run(sum, [1, 2])) == 3
    executor.shutdown()


async def test_workers_do_not_preempt_the_loop_that_wakes_them() -> None:
    executor = IoExecutor()
    assert await executor.run(os.sched_getscheduler, 0) == os.SCHED_BATCH
    assert os.sched_getscheduler(0) != os.SCHED_BATCH
    executor.shutdown()


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


async def test_an_idle_worker_keeps_nothing_of_its_last_job() -> None:
    executor = IoExecutor()
    try:
        result = await executor.run(np.empty, 1 << 20, np.uint8)
        alive = weakref.ref(result)
        del result
        await asyncio.sleep(0.01)  # the loop lets go of the delivered future
        assert alive() is None, "the worker's frame still holds the last result"
    finally:
        executor.shutdown()
