"""VolumeAdmission: one cap per volume for every front end; HTTP is refused at it, NBD waits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from app.errors import Unavailable
from app.io.admission import VolumeAdmission

pytestmark = pytest.mark.anyio


def volume(uuid: str) -> Any:
    return SimpleNamespace(uuid=uuid, name=uuid)


async def chunks(count: int) -> AsyncIterator[bytes]:
    for _ in range(count):
        yield b"x"


def test_past_the_limit_enter_raises_unavailable_with_retry_after() -> None:
    admission = VolumeAdmission(2)
    v = volume("a")
    admission.enter(v)
    admission.enter(v)
    with pytest.raises(Unavailable) as refused:
        admission.enter(v)
    assert refused.value.retry_after == 1
    admission.enter(volume("b"))
    admission.leave(v)
    admission.enter(v)


def test_a_slot_is_released_when_its_block_raises() -> None:
    admission = VolumeAdmission(1)
    v = volume("a")
    with pytest.raises(RuntimeError), admission.slot(v):
        raise RuntimeError
    assert admission.in_flight(v) == 0


async def test_a_stream_holds_its_slot_until_consumed() -> None:
    admission = VolumeAdmission(1)
    v = volume("a")
    admission.enter(v)
    stream = admission.streamed(v, chunks(3))
    assert await anext(stream) == b"x"
    assert admission.in_flight(v) == 1
    assert [c async for c in stream] == [b"x", b"x"]
    assert admission.in_flight(v) == 0


async def test_a_stream_dropped_half_way_releases_its_slot() -> None:
    admission = VolumeAdmission(1)
    v = volume("a")
    admission.enter(v)
    stream = admission.streamed(v, chunks(3))
    await anext(stream)
    await stream.aclose()
    assert admission.in_flight(v) == 0


def test_take_grants_what_the_cap_leaves_and_shares_it_with_enter() -> None:
    admission = VolumeAdmission(3)
    v = volume("a")
    admission.enter(v)
    assert admission.take(v, 5) == 2
    assert admission.take(v, 1) == 0
    with pytest.raises(Unavailable):
        admission.enter(v)
    admission.leave(v, 2)
    assert admission.in_flight(v) == 1


async def test_a_waiter_is_called_once_when_a_slot_frees() -> None:
    admission = VolumeAdmission(1)
    v = volume("a")
    admission.enter(v)
    calls: list[int] = []
    admission.when_free(v, lambda: calls.append(admission.take(v, 1)))
    await asyncio.sleep(0)
    assert calls == []
    admission.leave(v)
    await asyncio.sleep(0)
    assert calls == [1]
    admission.leave(v)
    await asyncio.sleep(0)
    assert calls == [1]
