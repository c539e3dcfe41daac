"""ByteBudget: one process-wide bound on the bytes held for clients; new requests are
refused at it, requests under way wait in order, and a buffer gives back when freed."""

from __future__ import annotations

import asyncio
import gc
import threading

import numpy as np
import pytest

from app.errors import Unavailable
from app.io.budget import ByteBudget

pytestmark = pytest.mark.anyio

MiB = 1 << 20


def test_a_take_past_the_budget_is_refused_with_retry_after_and_counted() -> None:
    budget = ByteBudget(4 * MiB)
    budget.take(3 * MiB, "a read")
    with pytest.raises(Unavailable) as refused:
        budget.take(2 * MiB, "a read")
    assert refused.value.retry_after == 1
    assert "REQCRYPT_MAX_BUFFERED_BYTES" in refused.value.detail
    assert (budget.held, budget.refused) == (3 * MiB, 1)


def test_one_request_larger_than_the_whole_budget_runs_alone() -> None:
    budget = ByteBudget(4 * MiB)
    size = budget.take(16 * MiB, "a batch")
    assert budget.held == 4 * MiB
    with pytest.raises(Unavailable):
        budget.take(1, "a read")
    budget.give(size)
    assert budget.held == 0


async def test_waiters_are_granted_in_arrival_order_as_bytes_are_given_back() -> None:
    budget = ByteBudget(4 * MiB)
    first = budget.take(4 * MiB, "a read")
    granted: list[str] = []

    async def wait(name: str, count: int) -> None:
        await budget.wait_take(count)
        granted.append(name)

    big = asyncio.create_task(wait("big", 3 * MiB))
    await asyncio.sleep(0)
    small = asyncio.create_task(wait("small", 1 * MiB))
    await asyncio.sleep(0)
    assert not budget.try_take(1), "a newcomer does not pass the queue"
    budget.give(first)
    await asyncio.gather(big, small)
    assert granted == ["big", "small"]
    assert budget.held == 4 * MiB


async def test_a_cancelled_waiter_leaves_nothing_held_and_lets_the_next_through() -> None:
    budget = ByteBudget(4 * MiB)
    first = budget.take(4 * MiB, "a read")
    cancelled = asyncio.create_task(budget.wait_take(4 * MiB))
    await asyncio.sleep(0)
    after = asyncio.create_task(budget.wait_take(1 * MiB))
    await asyncio.sleep(0)
    cancelled.cancel()
    budget.give(first)
    assert await after == 1 * MiB
    assert budget.held == 1 * MiB


async def test_a_buffer_gives_its_bytes_back_when_freed_on_any_thread() -> None:
    budget = ByteBudget(8 * MiB)
    buffer = np.empty(2 * MiB, dtype=np.uint8)
    budget.release_with(buffer, budget.take(2 * MiB, "a read"))
    holder = [buffer]
    del buffer
    dropper = threading.Thread(target=holder.clear)
    dropper.start()
    dropper.join()
    gc.collect()
    for _ in range(10):
        if not budget.held:
            break
        await asyncio.sleep(0.01)
    assert budget.held == 0


def test_drained_is_told_the_peak_once_nothing_is_held() -> None:
    peaks: list[int] = []
    budget = ByteBudget(8 * MiB, drained=peaks.append)
    a = budget.take(2 * MiB, "a")
    b = budget.take(3 * MiB, "b")
    budget.give(a)
    assert peaks == []
    budget.give(b)
    assert peaks == [5 * MiB]
    assert budget.peak == 5 * MiB
