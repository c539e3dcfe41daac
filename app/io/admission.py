"""Per-volume admission: one cap on the I/Os in flight on a volume, whatever front end
they came through.

Past ``max_ios`` (``REQCRYPT_MAX_VOLUME_IOS``) I/Os in flight on one volume, an HTTP
request is answered 503 with Retry-After rather than queued: a queued request would
still hold its connection, its body and a worker, which is what the cap protects.
An NBD request counts as one I/O too, but a block client cannot be told to retry:
its connection takes what slots are free (``take``) and holds the rest of its
requests, unread or pending, until a slot frees (``when_free``). Only the event
loop touches the counts, so they need no lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Protocol, TypeVar

from app.errors import Unavailable

T = TypeVar("T")


class Admitted(Protocol):
    """What admission knows of a volume: its uuid keys the count, its name the message."""

    @property
    def uuid(self) -> str: ...

    @property
    def name(self) -> str: ...


class VolumeAdmission:
    def __init__(self, max_ios: int) -> None:
        self.max_ios = max_ios
        self._in_flight: dict[str, int] = {}
        self._waiters: dict[str, list[Callable[[], None]]] = {}

    def enter(self, volume: Admitted) -> None:
        """One I/O in, or Unavailable (503, Retry-After) at the cap."""
        count = self._in_flight.get(volume.uuid, 0)
        if count >= self.max_ios:
            raise Unavailable(
                f"volume {volume.name} has {count} I/Os in flight, the most the service "
                "admits (REQCRYPT_MAX_VOLUME_IOS); retry shortly",
                retry_after=1,
            )
        self._in_flight[volume.uuid] = count + 1

    def take(self, volume: Admitted, wanted: int) -> int:
        """Up to ``wanted`` I/Os in, as many as the cap leaves; returns how many."""
        count = self._in_flight.get(volume.uuid, 0)
        granted = max(0, min(wanted, self.max_ios - count))
        if granted:
            self._in_flight[volume.uuid] = count + granted
        return granted

    def when_free(self, volume: Admitted, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, on the event loop, when an I/O of ``volume`` leaves."""
        self._waiters.setdefault(volume.uuid, []).append(callback)

    def leave(self, volume: Admitted, count: int = 1) -> None:
        remaining = self._in_flight[volume.uuid] - count
        if remaining:
            self._in_flight[volume.uuid] = remaining
        else:
            del self._in_flight[volume.uuid]
        waiters = self._waiters.pop(volume.uuid, None)
        if waiters:
            loop = asyncio.get_running_loop()
            for callback in waiters:
                loop.call_soon(callback)

    def in_flight(self, volume: Admitted) -> int:
        return self._in_flight.get(volume.uuid, 0)

    def slot(self, volume: Admitted) -> _Slot:
        """One I/O in for a ``with`` block (``enter``, then ``leave``)."""
        return _Slot(self, volume)

    async def streamed(self, volume: Admitted, chunks: AsyncIterable[T]) -> AsyncIterator[T]:
        """Hold a slot (already entered) until a streamed response ends or is dropped."""
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            self.leave(volume)


class _Slot:
    """A class, not a generator context manager: every HTTP I/O takes one."""

    __slots__ = ("_admission", "_volume")

    def __init__(self, admission: VolumeAdmission, volume: Admitted) -> None:
        self._admission = admission
        self._volume = volume

    def __enter__(self) -> None:
        self._admission.enter(self._volume)

    def __exit__(self, *_: object) -> None:
        self._admission.leave(self._volume)
