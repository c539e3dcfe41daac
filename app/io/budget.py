"""One process-wide budget of bytes held for clients, HTTP and NBD together.

Every buffer a client can make the service hold for it — a request body being received,
a multi-range answer, a reply its client has not read yet — is taken from here before it
is allocated and given back when it is freed (``release_with``: when the last reference
to it goes, the transport's included), so that many slow or hostile clients
together hold at most ``REQCRYPT_MAX_BUFFERED_BYTES``, whatever each one asks for. A
request that finds the budget spent is refused (HTTP: 503 with Retry-After) or waits
(a request already under way, an NBD client that cannot be told to retry). Only the
event loop takes and gives (a buffer freed on another thread gives back through the
loop), so the counts need no lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections import deque
from collections.abc import Callable

from app.errors import Unavailable


class ByteBudget:
    def __init__(self, limit: int, *, drained: Callable[[int], None] | None = None) -> None:
        """``drained(peak)``: called when nothing is held any more, with the most held
        since it was last called (the process may then hand freed memory back)."""
        self.limit = limit
        self.held = 0
        self.peak = 0
        self.refused = 0
        self._since_drained = 0
        self._drained = drained
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    def _size(self, count: int) -> int:
        """What ``count`` bytes cost: one request larger than the whole budget may still
        run, alone."""
        return min(count, self.limit)

    def fits(self, count: int) -> bool:
        return self.held + self._size(count) <= self.limit and not self._waiters

    def try_take(self, count: int) -> bool:
        if not self.fits(count):
            return False
        self._add(self._size(count))
        return True

    def take(self, count: int, what: str) -> int:
        """``count`` bytes now, or Unavailable (503, Retry-After); returns what to give back."""
        if not self.try_take(count):
            self.refused += 1
            raise Unavailable(
                f"the service holds {self.held} bytes for clients, its budget is "
                f"{self.limit} (REQCRYPT_MAX_BUFFERED_BYTES): {what} of {count} bytes "
                "must wait; retry shortly",
                retry_after=1,
            )
        return self._size(count)

    async def wait_take(self, count: int) -> int:
        """``count`` bytes once there is room, in arrival order; returns what to give back."""
        size = self._size(count)
        if self.fits(size):
            self._add(size)
            return size
        waiter = asyncio.get_running_loop().create_future()
        entry = (size, waiter)
        self._waiters.append(entry)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.give(size)  # granted as it was cancelled
            else:
                with contextlib.suppress(ValueError):  # ``_wake`` dropped it already
                    self._waiters.remove(entry)
                self._wake()
            raise
        return size

    def give(self, size: int) -> None:
        self.held -= size
        self._wake()
        if not self.held and self._drained is not None and self._since_drained:
            peak, self._since_drained = self._since_drained, 0
            self._drained(peak)

    def release_with(self, owner: object, size: int) -> None:
        """Give ``size`` back once ``owner`` (the object that holds a buffer's memory: an
        ndarray, not a view of it) is freed, on whatever thread drops it last."""
        loop = self._loop or asyncio.get_running_loop()
        self._loop = loop
        weakref.finalize(owner, _give_on, loop, self, size)

    def _add(self, size: int) -> None:
        self.held += size
        self.peak = max(self.peak, self.held)
        self._since_drained = max(self._since_drained, self.held)

    def _wake(self) -> None:
        while self._waiters:
            size, waiter = self._waiters[0]
            if waiter.done():
                self._waiters.popleft()
                continue
            if self.held + size > self.limit:
                return
            self._waiters.popleft()
            self._add(size)
            waiter.set_result(None)


def _give_on(loop: asyncio.AbstractEventLoop, budget: ByteBudget, size: int) -> None:
    with contextlib.suppress(RuntimeError):  # a closed loop: the process is stopping
        loop.call_soon_threadsafe(budget.give, size)
