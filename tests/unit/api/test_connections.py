"""``BodySink``'s landing: where the socket may be read straight into a route's buffer; and
the protocol's reads around a request's head."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from app.api.connections import HEAD_READ_BYTES, BodySink, _content_length, bounded_head_protocol
from tests.support.transport import Transport


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


def test_a_body_waits_in_the_socket_until_its_route_reads_it() -> None:
    """A head is read in small reads, and the body it announces is left in the socket until
    the route asks for it: read along with the head, it would be copied three times."""

    async def scenario() -> None:
        route_may_read = asyncio.Event()
        route_asked: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await route_may_read.wait()
            await receive()
            route_asked.set_result(transport.paused)

        config = uvicorn.Config(app, lifespan="off")
        config.load()
        connection = bounded_head_protocol(10.0)(
            config=config, server_state=ServerState(), app_state={}
        )
        transport = Transport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        buffer = connection.get_buffer(-1)
        assert len(buffer) == HEAD_READ_BYTES
        head = b"PUT /v1/null/data HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n"
        buffer[: len(head) + 100] = head + bytes(100)
        connection.buffer_updated(len(head) + 100)
        assert transport.paused  # the rest of the body stays in the socket for the route
        route_may_read.set()
        assert await route_asked is False  # asking for the body resumed reading
        connection.connection_lost(None)

    asyncio.run(scenario())


def test_a_head_longer_than_a_head_read_is_parsed_over_several_reads() -> None:
    """A head read is small (what arrives after a head is copied three times): a longer head,
    here with a header of three head reads, arrives in several and reaches the app whole."""

    async def scenario() -> None:
        seen: asyncio.Future[dict[bytes, bytes]] = asyncio.get_running_loop().create_future()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            seen.set_result(dict(scope["headers"]))

        config = uvicorn.Config(app, lifespan="off")
        config.load()
        connection = bounded_head_protocol(10.0)(
            config=config, server_state=ServerState(), app_state={}
        )
        connection.connection_made(Transport())  # type: ignore[arg-type]
        long = b"t" * (3 * HEAD_READ_BYTES)
        wire = b"GET /v1/null/data HTTP/1.1\r\nHost: x\r\nX-Long: " + long + b"\r\n\r\n"
        reads = 0
        while wire:
            buffer = connection.get_buffer(-1)
            assert len(buffer) == HEAD_READ_BYTES
            piece, wire = wire[: len(buffer)], wire[len(buffer) :]
            buffer[: len(piece)] = piece
            connection.buffer_updated(len(piece))
            reads += 1
        assert reads > 3
        assert (await seen)[b"x-long"] == long
        connection.connection_lost(None)

    asyncio.run(scenario())
