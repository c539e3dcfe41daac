"""I/O schedulers: ``none`` (FIFO) and ``mq-deadline`` (block/mq-deadline.c).

An elevator only chooses among requests the queue calls ready (no earlier
overlapping request pending, queue not held): it may reorder independent
requests but never one ahead of an earlier conflicting one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from bisect import bisect_left, insort
from collections.abc import Callable, Iterator

from app.blk.bio import WRITE_OPS
from app.blk.request import Request
from app.vocab import SECTOR_SHIFT, ElevatorName, Op

Ready = Callable[[Request], bool]

READ, WRITE = 0, 1


def _direction(rq: Request) -> int:
    return WRITE if rq.op in WRITE_OPS else READ


def _bypasses_sort(rq: Request) -> bool:
    """Flush-machinery requests go straight to the dispatch list, as in the kernel."""
    return rq.op is Op.FLUSH or rq.preflush or rq.fua


class Elevator(ABC):
    name: ElevatorName

    @abstractmethod
    def insert(self, rq: Request, now: int) -> None: ...

    @abstractmethod
    def remove(self, rq: Request) -> None:
        """Forget a queued request absorbed by a request-request merge."""

    @abstractmethod
    def next_request(self, now: int, ready: Ready) -> Request | None:
        """Remove and return the request to dispatch next, or None."""

    def dispatch_batch(self, now: int, ready: Ready, count: int, budget: int) -> list[Request]:
        """Remove and return up to ``count`` requests for one dispatch, until they hold
        ``budget`` bytes: the next ready request, then each next choice while it is ready
        (one that must wait ends the batch: a request the batch would unblock may not be
        overtaken by a later one)."""
        batch: list[Request] = []
        nbytes = 0
        blocked = False

        def in_order(rq: Request) -> bool:
            nonlocal blocked
            blocked = blocked or not ready(rq)
            return not blocked

        while len(batch) < count and nbytes < budget:
            rq = self.next_request(now, in_order if batch else ready)
            if rq is None:
                break
            batch.append(rq)
            nbytes += rq.nr_bytes
        return batch

    @abstractmethod
    def requests(self) -> Iterator[Request]:
        """Queued requests, oldest first."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def front_merged(self, rq: Request, old_sector: int) -> None:
        """``rq`` now starts earlier: re-sort it (dd_request_merged)."""


class NoneElevator(Elevator):
    """FIFO: dispatch the oldest ready request."""

    name: ElevatorName = "none"

    def __init__(self) -> None:
        self._fifo: dict[Request, None] = {}

    def insert(self, rq: Request, now: int) -> None:
        self._fifo[rq] = None

    def remove(self, rq: Request) -> None:
        self._fifo.pop(rq, None)

    def next_request(self, now: int, ready: Ready) -> Request | None:
        for rq in self._fifo:
            if ready(rq):
                del self._fifo[rq]
                return rq
        return None

    def dispatch_batch(self, now: int, ready: Ready, count: int, budget: int) -> list[Request]:
        """``Elevator.dispatch_batch`` in one pass over the FIFO: past the first ready
        request the next choice is the oldest left, so the batch ends at the first request
        that must wait, or at once if an older one was passed over."""
        batch: list[Request] = []
        nbytes = 0
        passed_over = False
        for rq in self._fifo:
            if len(batch) >= count or nbytes >= budget:
                break
            if not ready(rq):
                if batch:
                    break
                passed_over = True
                continue
            batch.append(rq)
            nbytes += rq.nr_sectors << SECTOR_SHIFT
            if passed_over:
                break
        fifo = self._fifo
        for rq in batch:
            del fifo[rq]
        return batch

    def front_merged(self, rq: Request, old_sector: int) -> None:
        """FIFO order does not depend on position."""

    def requests(self) -> Iterator[Request]:
        return iter(list(self._fifo))

    def __len__(self) -> int:
        return len(self._fifo)


class DeadlineElevator(Elevator):
    """mq-deadline: sector-sorted batches per direction, FIFO expiry, write starvation limit.

    Simplifications: one priority level; a FIFO is kept in insertion order, so
    a request whose deadline moved earlier through a merge is not re-queued.
    """

    name: ElevatorName = "mq-deadline"

    def __init__(
        self,
        *,
        read_expire_ms: int = 500,
        write_expire_ms: int = 5000,
        writes_starved: int = 2,
        fifo_batch: int = 16,
        front_merges: int = 1,
    ) -> None:
        self.expire_ns = (read_expire_ms * 1_000_000, write_expire_ms * 1_000_000)
        self.writes_starved = writes_starved
        self.fifo_batch = fifo_batch
        self.front_merges = front_merges
        self._dispatch: dict[Request, None] = {}
        self._fifo: tuple[dict[Request, None], dict[Request, None]] = ({}, {})
        self._sort: tuple[list[tuple[int, int, Request]], list[tuple[int, int, Request]]] = ([], [])
        self._sort_key: dict[Request, tuple[int, int]] = {}
        self._latest_pos = [0, 0]
        self._last_dir = READ
        self.batching = 0
        self.starved = 0

    def insert(self, rq: Request, now: int) -> None:
        if _bypasses_sort(rq):
            self._dispatch[rq] = None
            return
        direction = _direction(rq)
        if not rq.fifo_deadline:
            rq.fifo_deadline = now + self.expire_ns[direction]
        self._fifo[direction][rq] = None
        key = (rq.sector, rq.serial)
        self._sort_key[rq] = key
        insort(self._sort[direction], (*key, rq))

    def _unsort(self, rq: Request) -> None:
        key = self._sort_key.pop(rq)
        sort = self._sort[_direction(rq)]
        index = bisect_left(sort, key)
        del sort[index]

    def remove(self, rq: Request) -> None:
        if rq in self._dispatch:
            del self._dispatch[rq]
            return
        self._fifo[_direction(rq)].pop(rq, None)
        self._unsort(rq)

    def front_merged(self, rq: Request, old_sector: int) -> None:
        if rq in self._sort_key:
            self._unsort(rq)
            key = (rq.sector, rq.serial)
            self._sort_key[rq] = key
            insort(self._sort[_direction(rq)], (*key, rq))

    def _next_in_sort(self, direction: int) -> Request | None:
        """The request at or after the last dispatched position (deadline_next_request)."""
        sort = self._sort[direction]
        index = bisect_left(sort, (self._latest_pos[direction],))
        return sort[index][2] if index < len(sort) else None

    def _expired(self, direction: int, now: int) -> bool:
        fifo = self._fifo[direction]
        return bool(fifo) and next(iter(fifo)).fifo_deadline <= now

    def _take(self, rq: Request, direction: int) -> Request:
        del self._fifo[direction][rq]
        self._unsort(rq)
        self._latest_pos[direction] = rq.end_sector
        self._last_dir = direction
        self.batching += 1
        return rq

    def _first_ready(self, direction: int, start: Request | None, ready: Ready) -> Request | None:
        """Fallback when the chosen request must wait: next ready one in sector order."""
        sort = self._sort[direction]
        begin = 0 if start is None else bisect_left(sort, self._sort_key[start])
        for offset in range(len(sort)):
            candidate = sort[(begin + offset) % len(sort)][2]
            if ready(candidate):
                return candidate
        return None

    def next_request(self, now: int, ready: Ready) -> Request | None:
        for flush_rq in self._dispatch:
            if ready(flush_rq):
                del self._dispatch[flush_rq]
                return flush_rq
        # Continue the current batch in sector order while entitled to.
        rq = self._next_in_sort(self._last_dir)
        if rq is not None and self.batching < self.fifo_batch and ready(rq):
            return self._take(rq, self._last_dir)
        reads, writes = self._fifo
        if reads:
            if writes and self.starved >= self.writes_starved:
                direction = WRITE
                self.starved = 0
            else:
                if writes:
                    self.starved += 1
                direction = READ
        elif writes:
            direction = WRITE
            self.starved = 0
        else:
            return None
        next_rq = self._next_in_sort(direction)
        if self._expired(direction, now) or next_rq is None:
            rq = next(iter(self._fifo[direction]))
        else:
            rq = next_rq
        self.batching = 0
        if not ready(rq):
            candidate = self._first_ready(direction, rq, ready)
            if candidate is None:
                other = READ if direction == WRITE else WRITE
                candidate = self._first_ready(other, None, ready)
                direction = other
            if candidate is None:
                return None
            rq = candidate
        return self._take(rq, direction)

    def requests(self) -> Iterator[Request]:
        queued = list(self._dispatch) + list(self._fifo[READ]) + list(self._fifo[WRITE])
        queued.sort(key=lambda rq: rq.serial)
        return iter(queued)

    def __len__(self) -> int:
        return len(self._dispatch) + len(self._fifo[READ]) + len(self._fifo[WRITE])


def make_elevator(name: ElevatorName) -> Elevator:
    if name == "none":
        return NoneElevator()
    if name == "mq-deadline":
        return DeadlineElevator()
    raise ValueError(name)
