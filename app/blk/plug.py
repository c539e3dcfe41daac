"""The plug: requests held briefly so that bios from concurrent submitters merge.

The kernel's plug is per task; HTTP handlers run on pool threads that each
submit one bio and sleep, so a per-thread plug would never merge anything.
This plug is shared by all submitters of a queue and is flushed when its
window expires or, as in blk_add_rq_to_plug, before adding a request when it
already holds BLK_MAX_REQUEST_COUNT requests or its last request has reached
BLK_PLUG_FLUSH_SIZE.
"""

from __future__ import annotations

from app.blk.request import Request, RqState

BLK_MAX_REQUEST_COUNT = 32
BLK_PLUG_FLUSH_SIZE = 128 * 1024


class Plug:
    """Requests of the current plug generation; not thread-safe (the queue locks)."""

    __slots__ = ("flusher", "generation", "last", "open_time", "requests")

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.generation = 0
        self.open_time = 0
        self.last: Request | None = None
        # A waiter has taken charge of flushing this generation when its window ends.
        self.flusher = False

    def __len__(self) -> int:
        return len(self.requests)

    def start_plug(self, now: int) -> None:
        """Open the window at the first request of a generation (blk_start_plug)."""
        self.open_time = now

    def needs_flush(self) -> bool:
        """Whether adding one more request must first flush the plug."""
        last = self.last
        return len(self.requests) >= BLK_MAX_REQUEST_COUNT or (
            last is not None and last.nr_bytes >= BLK_PLUG_FLUSH_SIZE
        )

    def add_request(self, rq: Request, now: int) -> None:
        if not self.requests:
            self.start_plug(now)
        rq.state = RqState.PLUGGED
        self.requests.append(rq)
        self.last = rq

    def remove(self, rq: Request) -> None:
        """Drop a request absorbed by a request-request merge."""
        self.requests.remove(rq)
        if self.last is rq:
            self.last = self.requests[-1] if self.requests else None

    def finish_plug(self) -> list[Request]:
        """Take every request, in submission order, and start a new generation."""
        requests = self.requests
        self.requests = []
        self.last = None
        self.flusher = False
        self.generation += 1
        return requests
