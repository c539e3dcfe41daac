"""uvicorn's HTTP/1.1 protocol with the bounds it lacks on a request's head.

uvicorn bounds an idle keep-alive connection (``timeout_keep_alive``) and nothing
else before a request exists: a connection that never sends a byte is kept for
ever, and the keep-alive timer stops at the first byte, so headers sent one byte a
minute (slowloris) hold a connection for ever too; with httptools no size bounds
the head either. Here every request's line and headers must arrive within
``head_timeout`` of the connection (first request) or of their first byte (later
ones; until that byte, the keep-alive timer applies), and within
``MAX_HEAD_BYTES``. Past the deadline a partial head gets 408, a connection that
sent nothing is just closed; an oversized head gets 431. Both close the connection.
Bodies are bounded by the service itself (``REQCRYPT_BODY_TIMEOUT_SECONDS``).
"""

from __future__ import annotations

import asyncio
from asyncio import TimerHandle

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEAD_BYTES = 64 << 10
"""A request line and headers together; nginx's default allows 4 x 8 KiB lines."""


class BoundedHeadProtocol(HttpToolsProtocol):
    head_timeout: float = 10.0

    _head_deadline: TimerHandle | None = None
    _head_bytes: int = 0
    _in_head: bool = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_head()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_head and self._head_deadline is None:  # a keep-alive's next request
            self._start_head()
        head = self._in_head
        super().data_received(data)
        if head and self._in_head:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                self._refuse(431, "Request Header Fields Too Large")

    def on_headers_complete(self) -> None:
        self._end_head()
        super().on_headers_complete()

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

    def _refuse(self, status: int, phrase: str) -> None:
        self._end_head()
        body = (
            f"{phrase}: a request's line and headers must arrive within "
            f"REQCRYPT_HEAD_TIMEOUT_SECONDS and {MAX_HEAD_BYTES} bytes"
        )
        self.transport.write(
            (
                f"HTTP/1.1 {status} {phrase}\r\ncontent-type: text/plain; charset=utf-8\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n{body}"
            ).encode("ascii")
        )
        self.transport.close()


def bounded_head_protocol(head_timeout: float) -> type[BoundedHeadProtocol]:
    """The protocol class for ``uvicorn.run(http=…)``, which instantiates it itself."""
    return type("BoundedHeadProtocol", (BoundedHeadProtocol,), {"head_timeout": head_timeout})
