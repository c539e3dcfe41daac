"""Deadlines for request bodies: a client trickling a body holds its connection for a
bounded time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator

from app.errors import RequestTimeout


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
            raise RequestTimeout(
                f"the request body did not arrive in time (REQCRYPT_BODY_TIMEOUT_SECONDS "
                f"{timeout:g} s per piece, REQCRYPT_BODY_MIN_RATE_BYTES {min_rate} B/s overall)"
            ) from None
        yield piece
