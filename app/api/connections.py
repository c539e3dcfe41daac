"""uvicorn's HTTP/1.1 protocol with the bounds it lacks on a request's head.

uvicorn bounds an idle keep-alive connection (``timeout_keep_alive``) and nothing
else: no cap on connections before a request exists (``limit_concurrency`` answers 503
only once a head has been read), and a client that stops reading its answer keeps it
in the transport's buffer for ever. Here a connection past ``max_connections`` is
answered 503 and closed at once, and a reply that makes no progress towards its client
for ``send_timeout`` seconds (nginx's ``send_timeout``) closes the connection, which
frees what it held. Before a request exists, a connection that never sends a byte is kept for
ever, and the keep-alive timer stops at the first byte, so headers sent one byte a
minute (slowloris) hold a connection for ever too; with httptools no size bounds
the head either. Here every request's line and headers must arrive within
``head_timeout`` of the connection (first request) or of their first byte (later
ones; until that byte, the keep-alive timer applies), and within
``MAX_HEAD_BYTES``. Past the deadline a partial head gets 408, a connection that
sent nothing is just closed; an oversized head gets 431. Both close the connection.
Bodies are bounded by the service itself (``REQCRYPT_BODY_TIMEOUT_SECONDS``).

It also lets a route take a request's body straight into its own buffer
(``BodySink``, found in ``scope["extensions"]``): uvicorn's ASGI ``receive`` copies
each body piece twice more (into the cycle's bytearray, then out as ``bytes``) and
wakes the route once per piece; a sink copies each piece once, where it belongs,
and wakes the route once its buffer is full. The protocol reads the socket into
buffers it gives (``get_buffer``), not into the loop's ``bytes``: while a route waits
in ``readinto`` for a Content-Length body, the kernel copies the body straight into
the route's buffer, and the sink only counts them (the parser does not see them: it would
copy them into a ``bytes`` it then drops). For that the body must still be in the socket when
the route comes to read it: a head is read in small reads (``HEAD_READ_BYTES``), and reading
pauses once a head whose body goes on has been parsed, until the route asks for the body.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from asyncio import TimerHandle
from collections import deque
from typing import Any

import httptools
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

MAX_HEAD_BYTES = 64 << 10
"""A request line and headers together; nginx's default allows 4 x 8 KiB lines."""

RECEIVE_BYTES = 256 << 10
"""The socket is read this much at a time outside a body landing in place (uvloop's size)."""

HEAD_READ_BYTES = 4 << 10
"""A read while a request's head is awaited takes at most this much: what follows a head is
its body, which the route's buffer takes straight from the socket once it reads it; read here,
it would be copied three times (into a ``bytes``, ``cycle.body`` and then the buffer). A page
holds a usual head; a longer one takes more reads."""


SINK = "reqcrypt.body_sink"
"""The extension (``scope["extensions"][SINK]["sink"]``) that carries a request's ``BodySink``."""


class BodySink:
    """One request's body, copied by the protocol straight into buffers the route gives.

    Until the route ``claim``s it, the body goes to uvicorn's ``receive`` as usual;
    from then on each piece the parser yields is copied into the buffer of the pending
    ``readinto``, or kept (reading paused past uvicorn's high-water mark) until one comes.
    """

    def __init__(
        self, protocol: BoundedHeadProtocol, cycle: RequestResponseCycle, length: int | None
    ) -> None:
        self._protocol = protocol
        self._cycle = cycle
        self.unparsed = length
        """Body bytes the parser has still to see (Content-Length framing), None when the
        body is chunked: the bytes on the wire are then not all body."""
        self._loop = protocol.loop
        self._kept: deque[memoryview] = deque()
        self._kept_bytes = 0
        self._target: memoryview | None = None
        self._filled = 0
        self._waiter: asyncio.Future[None] | None = None
        self.claimed = False
        self.arrived_at = self._loop.time()
        """``loop.time()`` of the last piece, or of the ``readinto`` that began waiting for
        the next: the per-piece deadline counts from it."""

    def claim(self) -> None:
        """Take the body over from ``receive``, with what it has buffered already."""
        cycle = self._cycle
        self.claimed = True
        if cycle.waiting_for_100_continue and not cycle.transport.is_closing():
            cycle.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            cycle.waiting_for_100_continue = False
        if cycle.body:
            self._kept.append(memoryview(cycle.body))
            self._kept_bytes = len(cycle.body)
            cycle.body = bytearray()

    @property
    def ended(self) -> bool:
        """The whole body has arrived (or the client is gone): nothing more will come."""
        return not self._cycle.more_body or self._cycle.disconnected

    def feed(self, piece: bytes) -> None:
        """A piece from the parser: into the pending buffer, the rest kept."""
        self.arrived_at = self._loop.time()
        view = memoryview(piece)
        target = self._target
        if target is not None:
            take = min(len(view), len(target) - self._filled)
            target[self._filled : self._filled + take] = view[:take]
            self._filled += take
            view = view[take:]
            if self._filled == len(target):
                self.wake()
        if view:
            self._kept.append(view)
            self._kept_bytes += len(view)
            if self._kept_bytes > HIGH_WATER_LIMIT:
                self._protocol.flow.pause_reading()

    def landing(self) -> memoryview | None:
        """Where the socket may be read straight into: the pending ``readinto``'s free
        space, no more than the body's rest. None when the next bytes may be something else
        or belong after bytes kept."""
        target = self._target
        unparsed = self.unparsed
        if target is None or self._kept or not unparsed or self._cycle.response_complete:
            return None
        end = min(len(target), self._filled + unparsed)
        return target[self._filled : end] if end > self._filled else None

    def landed(self, count: int) -> None:
        """``count`` bytes of body were read into ``landing()``'s view: already in place."""
        self.arrived_at = self._loop.time()
        self._filled += count
        if self._target is not None and self._filled == len(self._target):
            self.wake()

    def wake(self) -> None:
        """The pending ``readinto`` re-checks: its buffer is full or the body ended."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _take_kept(self, buffer: memoryview) -> int:
        filled = 0
        kept = self._kept
        while kept and filled < len(buffer):
            view = kept[0]
            take = min(len(view), len(buffer) - filled)
            buffer[filled : filled + take] = view[:take]
            filled += take
            if take == len(view):
                kept.popleft()
            else:
                kept[0] = view[take:]
        self._kept_bytes -= filled
        return filled

    async def readinto(self, buffer: memoryview, timeout: float, deadline: float) -> int:
        """Fill ``buffer``; fewer bytes only where the body ends. Raises TimeoutError when no
        piece came for ``timeout`` seconds or ``deadline`` (``loop.time()``) passed, and
        ClientDisconnect when the client went away."""
        filled = self._take_kept(buffer)
        if filled == len(buffer) or self.ended:
            return self._checked(filled)
        self._target, self._filled = buffer, filled
        # The next piece's clock starts now: while the route was busy, reading was paused.
        self.arrived_at = self._loop.time()
        try:
            self._protocol.flow.resume_reading()
            while self._filled < len(buffer) and not self.ended:
                wait = min(self.arrived_at + timeout, deadline) - self._loop.time()
                if wait <= 0:
                    raise TimeoutError
                self._waiter = self._loop.create_future()
                timer = self._loop.call_later(wait, self.wake)
                try:
                    await self._waiter
                finally:
                    timer.cancel()
                    self._waiter = None
            return self._checked(self._filled)
        finally:
            self._target = None

    def _checked(self, filled: int) -> int:
        if self._cycle.disconnected:
            raise ClientDisconnect
        return filled


class _Receive(threading.local):
    def __init__(self) -> None:
        self.buffer = memoryview(bytearray(RECEIVE_BYTES))
        self.head = self.buffer[:HEAD_READ_BYTES]


_receive = _Receive()
"""One receive buffer per event loop thread: the parser copies what it keeps before
``buffer_updated`` returns, so connections can share it."""


class BoundedHeadProtocol(HttpToolsProtocol):
    head_timeout: float = 10.0
    send_timeout: float = 30.0
    max_connections: int = 1 << 20

    _head_deadline: TimerHandle | None = None
    _send_deadline: TimerHandle | None = None
    _unsent: int = 0
    _head_bytes: int = 0
    _in_head: bool = False
    _sink: BodySink | None = None
    _reading: memoryview | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.server_state.connections) > self.max_connections:
            self._close_with(
                503,
                "Service Unavailable",
                "the server has REQCRYPT_MAX_CONNECTIONS connections open; retry shortly",
                "retry-after: 1\r\n",
            )
            return
        self._start_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_head()
        self._end_send()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            _collect_soon(self.loop)
        super().connection_lost(exc)
        # uvicorn cancels its keep-alive timer only on a clean close: after a reset the
        # timer would keep this connection, and all it held, for timeout_keep_alive.
        self._unset_keepalive_if_required()
        if self._sink is not None:
            self._sink.wake()

    def get_buffer(self, sizehint: int) -> memoryview:
        sink = self._sink
        landing = None if sink is None else sink.landing()
        self._reading = landing
        if landing is not None:
            return landing
        return _receive.head if self._in_head else _receive.buffer

    def buffer_updated(self, nbytes: int) -> None:
        if self.transport.is_closing():  # refused at the cap, or timed out: nothing to read
            return
        landing = self._reading
        self._reading = None
        if landing is not None:
            self._bypass(nbytes, None)
            return
        data = _receive.buffer[:nbytes]
        sink = self._sink
        if sink is not None and sink.claimed and sink.unparsed:
            body = min(nbytes, sink.unparsed)
            self._bypass(body, data[:body])
            data = data[body:]
        if data:
            head = self._in_head
            self.data_received(data)
            sink = self._sink
            if head and not self._in_head and sink is not None and sink.unparsed:
                # A head ended here and its body goes on: it waits in the socket until the
                # route reads it (``BodySink.readinto`` and ``receive`` resume reading).
                self.flow.pause_reading()

    def _bypass(self, count: int, piece: memoryview | None) -> None:
        """Body bytes of a claimed Content-Length body, past the parser, which would copy each
        into a ``bytes`` only to count it: landed in place (``piece`` None) or to keep. Once
        the body is whole, a new parser (the old one still waits for it) takes the next head."""
        sink = self._sink
        assert sink is not None  # only a claimed body with a Content-Length comes here
        assert sink.unparsed is not None
        sink.unparsed -= count
        if piece is None:
            sink.landed(count)
        elif not self.cycle.response_complete:
            sink.feed(bytes(piece))
        if not sink.unparsed:
            self.parser = _parser(self)
            self.on_message_complete()

    def data_received(self, data: bytes | memoryview) -> None:
        if self._in_head and self._head_deadline is None:  # a keep-alive's next request
            self._start_head()
        head = self._in_head
        super().data_received(data)  # type: ignore[arg-type]  # httptools parses any buffer
        if head and self._in_head:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                self._refuse(431, "Request Header Fields Too Large")

    def on_headers_complete(self) -> None:
        self._end_head()
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:  # not an upgrade
            self._sink = BodySink(self, cycle, _content_length(self.headers))
            self.scope.setdefault("extensions", {})[SINK] = {"sink": self._sink}

    def on_body(self, body: bytes) -> None:
        sink = self._sink
        if sink is not None and sink.unparsed is not None:
            sink.unparsed -= len(body)
        if sink is None or not sink.claimed or self.cycle.response_complete:
            super().on_body(body)
            return
        sink.feed(body)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self._sink is not None:
            self._sink.wake()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.cycle is None or self.cycle.response_complete:  # no pipelined request started
            self._in_head = True  # its deadline starts with the next request's first byte
            self._head_bytes = 0

    def _start_head(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        self._head_deadline = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def _end_head(self) -> None:
        self._in_head = False
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_timed_out(self) -> None:
        self._head_deadline = None
        if self.transport.is_closing():
            return
        if self._head_bytes:
            self._refuse(408, "Request Timeout")
        else:
            self.transport.close()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_deadline is None:
            self._unsent = self.transport.get_write_buffer_size()
            self._send_deadline = self.loop.call_later(self.send_timeout, self._send_timed_out)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._end_send()

    def _end_send(self) -> None:
        if self._send_deadline is not None:
            self._send_deadline.cancel()
            self._send_deadline = None

    def _send_timed_out(self) -> None:
        """The client took nothing of its answer for ``send_timeout``: drop it (abort, not
        close: a close would wait to send what it will not take)."""
        unsent = self.transport.get_write_buffer_size()
        if 0 < unsent < self._unsent:  # it is reading, slowly: another period
            self._unsent = unsent
            self._send_deadline = self.loop.call_later(self.send_timeout, self._send_timed_out)
            return
        self._send_deadline = None
        self.transport.abort()

    def _refuse(self, status: int, phrase: str) -> None:
        self._end_head()
        self._close_with(
            status,
            phrase,
            f"{phrase}: a request's line and headers must arrive within "
            f"REQCRYPT_HEAD_TIMEOUT_SECONDS and {MAX_HEAD_BYTES} bytes",
        )

    def _close_with(self, status: int, phrase: str, body: str, headers: str = "") -> None:
        self.transport.write(
            (
                f"HTTP/1.1 {status} {phrase}\r\ncontent-type: text/plain; charset=utf-8\r\n"
                f"content-length: {len(body)}\r\n{headers}connection: close\r\n\r\n{body}"
            ).encode("ascii")
        )
        self.transport.close()


COLLECT_AFTER = 0.1
"""Seconds from a client leaving mid-answer to the collection that frees what it held: a
burst of such clients is one collection."""

_collection: dict[asyncio.AbstractEventLoop, asyncio.TimerHandle] = {}


def _collect_soon(loop: asyncio.AbstractEventLoop) -> None:
    """A client that leaves mid-request (its body or its answer cut short) ends the request
    with an exception whose traceback holds the frames that held its buffers: a reference
    cycle that the cyclic collector frees only at its next full collection (``reqcrypt
    serve`` lets the young generation grow). Collect once, shortly, so the memory comes back
    when the client goes."""
    if loop not in _collection:
        _collection[loop] = loop.call_later(COLLECT_AFTER, _collect, loop)


def _collect(loop: asyncio.AbstractEventLoop) -> None:
    del _collection[loop]
    gc.collect()


def _parser(protocol: BoundedHeadProtocol) -> httptools.HttpRequestParser:
    """A parser at the start of a message, as uvicorn's protocol makes its own."""
    parser = httptools.HttpRequestParser(protocol)
    parser.set_dangerous_leniencies(lenient_data_after_close=True)
    return parser


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The body's length when Content-Length frames it (the parser has checked the value;
    a Transfer-Encoding, or several lengths, leave it to the parser)."""
    length = None
    for name, value in headers:  # a loop, not comprehensions: no calls per header
        if name == b"transfer-encoding" or (name == b"content-length" and length is not None):
            return None
        if name == b"content-length":
            length = value.strip()
    return int(length) if length is not None and length.isdigit() else None


class BufferedConnection(asyncio.BufferedProtocol):
    """What the event loop sees of a connection: a buffered protocol, so that the socket is
    read into ``get_buffer``'s buffer (uvloop reads into its own ``bytes`` for any subclass
    of ``asyncio.Protocol``, which uvicorn's protocol is); the rest is the HTTP protocol's."""

    http_class: type[BoundedHeadProtocol] = BoundedHeadProtocol

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.http = self.http_class(*args, **kwargs)
        self.get_buffer = self.http.get_buffer  # type: ignore[method-assign]
        self.buffer_updated = self.http.buffer_updated  # type: ignore[method-assign]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.http.connection_made(transport)  # type: ignore[arg-type]

    def connection_lost(self, exc: Exception | None) -> None:
        self.http.connection_lost(exc)

    def eof_received(self) -> None:
        self.http.eof_received()

    def pause_writing(self) -> None:
        self.http.pause_writing()

    def resume_writing(self) -> None:
        self.http.resume_writing()


def bounded_head_protocol(
    head_timeout: float, *, send_timeout: float = 30.0, max_connections: int = 1 << 20
) -> type[BufferedConnection]:
    """The protocol class for ``uvicorn.run(http=…)``, which instantiates it itself."""
    http_class = type(
        "BoundedHeadProtocol",
        (BoundedHeadProtocol,),
        {
            "head_timeout": head_timeout,
            "send_timeout": send_timeout,
            "max_connections": max_connections,
        },
    )
    return type("BufferedConnection", (BufferedConnection,), {"http_class": http_class})
