"""Deadlines for request bodies: a client trickling a body holds its connection for a
bounded time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator

from starlette.requests import Request

from app.api.connections import SINK, BodySink
from app.config import HttpLimits
from app.errors import RequestTimeout


def _timed_out(timeout: float, min_rate: int) -> RequestTimeout:
    return RequestTimeout(
        f"the request body did not arrive in time (REQCRYPT_BODY_TIMEOUT_SECONDS "
        f"{timeout:g} s per piece, REQCRYPT_BODY_MIN_RATE_BYTES {min_rate} B/s overall)"
    )


async def body_within_deadline(
    stream: AsyncIterable[bytes], length: int, timeout: float, min_rate: int
) -> AsyncIterator[bytes]:
    """A request body that must keep coming: each piece within ``timeout`` seconds and the
    whole within ``timeout + length / min_rate``, else RequestTimeout (408)."""
    deadline = time.monotonic() + timeout + length / min_rate
    pieces = aiter(stream)
    while True:
        wait = min(timeout, deadline - time.monotonic())
        try:
            async with asyncio.timeout(max(wait, 0)):
                piece = await anext(pieces)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise _timed_out(timeout, min_rate) from None
        yield piece


class BodyReader:
    """A request body read into the caller's buffers, under ``body_within_deadline``'s
    deadlines. Behind reqcrypt's own HTTP protocol the pieces are copied once, straight
    into the buffer (``BodySink``); elsewhere (an in-process ASGI client) they come from
    ``request.stream()``."""

    def __init__(self, request: Request, length: int, limits: HttpLimits) -> None:
        timeout = self._timeout = limits.body_timeout_seconds
        min_rate = self._min_rate = limits.body_min_rate_bytes
        extension = request.scope.get("extensions", {}).get(SINK)
        self._sink: BodySink | None = None if extension is None else extension["sink"]
        if self._sink is not None:
            self._sink.claim()
            self._deadline = asyncio.get_running_loop().time() + timeout + length / min_rate
            return
        self._pieces = aiter(body_within_deadline(request.stream(), length, timeout, min_rate))
        self._rest = memoryview(b"")

    async def readinto(self, buffer: memoryview) -> int:
        """Fill ``buffer``; fewer bytes only where the body ends."""
        if self._sink is not None:
            try:
                return await self._sink.readinto(buffer, self._timeout, self._deadline)
            except TimeoutError:
                raise _timed_out(self._timeout, self._min_rate) from None
        filled = 0
        while filled < len(buffer):
            if not self._rest:
                piece = await anext(self._pieces, None)
                if piece is None:
                    break
                self._rest = memoryview(piece)
            take = min(len(self._rest), len(buffer) - filled)
            buffer[filled : filled + take] = self._rest[:take]
            self._rest = self._rest[take:]
            filled += take
        return filled
