"""VolumeAdmission: a slot per I/O in flight, held by a streamed response until it ends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from app.api.admission import VolumeAdmission
from app.errors import Unavailable

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
