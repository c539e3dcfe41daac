"""``BodySink``'s landing: where the socket may be read straight into a route's buffer."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from app.api.connections import BodySink, _content_length


def test_only_a_single_content_length_without_transfer_encoding_frames_a_body() -> None:
    assert _content_length([(b"content-length", b"4096")]) == 4096
    assert _content_length([(b"content-length", b"5"), (b"transfer-encoding", b"chunked")]) is None
    assert _content_length([(b"content-length", b"5"), (b"content-length", b"5")]) is None
    assert _content_length([(b"host", b"x")]) is None


def sink(length: int | None) -> tuple[BodySink, Any]:
    loop = asyncio.get_running_loop()
    flow = SimpleNamespace(pause_reading=lambda: None, resume_reading=lambda: None)
    protocol = SimpleNamespace(loop=loop, flow=flow)
    cycle = SimpleNamespace(
        more_body=True,
        disconnected=False,
        response_complete=False,
        body=bytearray(),
        waiting_for_100_continue=False,
    )
    body = BodySink(protocol, cycle, length)  # type: ignore[arg-type]
    body.claim()
    return body, cycle


def test_a_waiting_readinto_takes_the_body_in_place_up_to_its_end() -> None:
    async def scenario() -> None:
        body, _ = sink(6)
        assert body.landing() is None  # no readinto waiting: the bytes may go anywhere
        buffer = memoryview(bytearray(8))
        reading = asyncio.ensure_future(body.readinto(buffer, 5.0, body.arrived_at + 5.0))
        await asyncio.sleep(0)
        landing = body.landing()
        assert landing is not None
        assert len(landing) == 6
        landing[:4] = b"abcd"
        body.unparsed = 2
        body.landed(4)
        landing = body.landing()
        assert landing is not None
        assert len(landing) == 2
        landing[:2] = b"ef"
        body.unparsed = 0
        body.landed(2)
        assert body.landing() is None
        body._cycle.more_body = False
        body.wake()
        assert await reading == 6
        assert bytes(buffer[:6]) == b"abcdef"

    asyncio.run(scenario())


def test_a_chunked_body_never_lands_in_place() -> None:
    async def scenario() -> None:
        body, _ = sink(None)  # its bytes on the wire hold chunk sizes too
        buffer = memoryview(bytearray(4))
        reading = asyncio.ensure_future(body.readinto(buffer, 5.0, body.arrived_at + 5.0))
        await asyncio.sleep(0)
        assert body.landing() is None
        body.feed(b"abcd")
        assert await reading == 4
        assert bytes(buffer) == b"abcd"

    asyncio.run(scenario())
