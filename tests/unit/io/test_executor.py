"""The data path's thread pool: results, errors, concurrency and shutdown."""

from __future__ import annotations

import threading

import anyio
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
