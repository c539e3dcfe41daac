"""Per-volume admission of HTTP I/O and deadlines for request bodies.

Past ``max_volume_ios`` I/Os in flight on one volume, a new one is answered 503
with Retry-After rather than queued: a queued request would still hold its
connection, its body and a worker, which is what the limit protects. Only the
event loop touches the counts, so they need no lock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterator
from contextlib import contextmanager
from typing import TypeVar

from app.dm.volume import Volume
from app.errors import RequestTimeout, Unavailable

T = TypeVar("T")


class VolumeAdmission:
    def __init__(self, max_ios: int) -> None:
        self.max_ios = max_ios
        self._in_flight: dict[str, int] = {}

    def enter(self, volume: Volume) -> None:
        count = self._in_flight.get(volume.uuid, 0)
        if count >= self.max_ios:
            raise Unavailable(
                f"volume {volume.name} has {count} I/Os in flight, the most the service "
                "admits (REQCRYPT_MAX_VOLUME_IOS); retry shortly",
                retry_after=1,
            )
        self._in_flight[volume.uuid] = count + 1

    def leave(self, volume: Volume) -> None:
        count = self._in_flight[volume.uuid] - 1
        if count:
            self._in_flight[volume.uuid] = count
        else:
            del self._in_flight[volume.uuid]

    def in_flight(self, volume: Volume) -> int:
        return self._in_flight.get(volume.uuid, 0)

    @contextmanager
    def slot(self, volume: Volume) -> Iterator[None]:
        self.enter(volume)
        try:
            yield
        finally:
            self.leave(volume)

    async def streamed(self, volume: Volume, chunks: AsyncIterable[T]) -> AsyncIterator[T]:
        """Hold a slot (already entered) until a streamed response ends or is dropped."""
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            self.leave(volume)


async def paced(
    stream: AsyncIterable[bytes], length: int, timeout: float, min_rate: int
) -> AsyncIterator[bytes]:
    """A request body that must keep coming: each piece within ``timeout`` seconds and the
    whole within ``timeout + length / min_rate``, else RequestTimeout (408). A client
    trickling a body then holds its connection for a bounded time."""
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
