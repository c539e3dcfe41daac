"""Per-queue I/O statistics with the meaning of ``iostat -x`` columns.

Counters are updated on the I/O path under a private lock and never touch
SQL; ``snapshot()`` derives the averages. ``in_flight`` counts requests from
creation (plugged, queued or dispatched) to completion, and ``aqu_sz`` is
its time-weighted average, like the kernel's time_in_queue / interval.
``queued`` is the part of it still waiting for a device tag, and ``*_d2c``
the average time a request spent on the device (blktrace's dispatch to
complete; a request dispatched in a batch is on the device from the batch's
dispatch): ``*_await`` minus ``*_d2c`` is time spent queued.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from app.blk.bio import WRITE_OPS
from app.blk.request import Request
from app.vocab import REQ_OP_FLUSH, SECTOR_SHIFT, Op

_GROUPS = ("r", "w", "d", "f")


def _group(op: Op) -> str:
    """iostat's stat groups: discard and flush apart, write_zeroes counts as a write."""
    if op is Op.READ:
        return "r"
    if op is Op.DISCARD:
        return "d"
    if op is Op.FLUSH:
        return "f"
    return "w" if op in WRITE_OPS else "r"


#: ``_group`` of each op, for the per-request loops.
_GROUP_OF = {op: _group(op) for op in Op}


class QueueStats:
    """Thread-safe counters; one instance per queue (the lead may share one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            now = time.perf_counter_ns()
            self._bios = dict.fromkeys(_GROUPS, 0)
            self._ios = dict.fromkeys(_GROUPS, 0)
            self._merges = dict.fromkeys(_GROUPS, 0)
            self._sectors = dict.fromkeys(_GROUPS, 0)
            self._bio_wait_ns = dict.fromkeys(_GROUPS, 0)
            self._bios_done = dict.fromkeys(_GROUPS, 0)
            self._d2c_ns = dict.fromkeys(_GROUPS, 0)
            self.front_merges = 0
            self.back_merges = 0
            self.request_merges = 0
            self.engine_calls = 0
            self.crypto_ns = 0
            self.queue_ns = 0.0
            self.histogram: dict[int, int] = {}
            self._reset_time = now
            self._last_change = now
            # in_flight is a level, not a counter: it survives reset.
            self.in_flight = getattr(self, "in_flight", 0)
            self.on_device = getattr(self, "on_device", 0)
            self._weighted_ns = 0
            self._busy_ns = 0

    def _tick(self, now: int) -> None:
        elapsed = now - self._last_change
        if elapsed <= 0:
            return  # a completion stamped before the last change (a batch's earlier request)
        if self.in_flight:
            self._weighted_ns += self.in_flight * elapsed
            self._busy_ns += elapsed
        self._last_change = now

    def account_bio(self, op: Op, merge: str | None) -> None:
        """A bio entered the queue; ``merge`` is "front"/"back" when it joined a request."""
        with self._lock:
            group = _group(op)
            self._bios[group] += 1
            if merge is not None:
                self._merges[group] += 1
                if merge == "back":
                    self.back_merges += 1
                else:
                    self.front_merges += 1

    def bios_queued(
        self,
        now: int,
        started: dict[Op, int],
        merges: dict[Op, int],
        back_merges: int,
        front_merges: int,
    ) -> None:
        """A batch's ``request_started`` and ``account_bio`` calls, all at ``now``, in one:
        ``started`` new requests and ``merges`` bios that joined one, by op."""
        with self._lock:
            requests = sum(started.values())
            if requests:
                self._tick(now)
                self.in_flight += requests
            for op, count in started.items():
                self._bios[_group(op)] += count
            for op, count in merges.items():
                group = _group(op)
                self._bios[group] += count
                self._merges[group] += count
            self.back_merges += back_merges
            self.front_merges += front_merges

    def request_started(self, now: int, op: Op) -> None:
        """A request was created from a bio of ``op``; the bio is accounted with it."""
        with self._lock:
            self._tick(now)
            self.in_flight += 1
            self._bios[_group(op)] += 1

    def requests_dispatched(self, rqs: Sequence[Request], now: int) -> None:
        """The requests took device tags."""
        for rq in rqs:
            rq.dispatch_time = now
        with self._lock:
            self.on_device += len(rqs)

    def request_absorbed(self, op: Op, now: int) -> None:
        """A queued request merged into another: it counts as a merge, not an I/O."""
        with self._lock:
            self._tick(now)
            self.in_flight -= 1
            self._merges[_group(op)] += 1
            self.request_merges += 1

    def requests_done(self, rqs: Sequence[Request], times: Sequence[int]) -> None:
        """The requests completed, each at its time in ``times`` (in order); ``_tick`` of
        each inline, on locals stored back once for the batch."""
        with self._lock:
            histogram = self.histogram
            ios, sectors, d2c = self._ios, self._sectors, self._d2c_ns
            bio_wait, bios_done = self._bio_wait_ns, self._bios_done
            last, in_flight = self._last_change, self.in_flight
            weighted, busy = self._weighted_ns, self._busy_ns
            for rq, now in zip(rqs, times, strict=True):
                elapsed = now - last
                if elapsed > 0:  # else stamped before the last change (see ``_tick``)
                    if in_flight:
                        weighted += in_flight * elapsed
                        busy += elapsed
                    last = now
                in_flight -= 1
                op = rq.op
                group = _GROUP_OF[op]
                if rq.dispatch_time:
                    self.on_device -= 1
                    d2c[group] += now - rq.dispatch_time
                ios[group] += 1
                nr_sectors = rq.nr_sectors
                sectors[group] += nr_sectors
                if op is not REQ_OP_FLUSH:
                    # The power-of-two KiB bucket holding the request (upper bound, >= 1).
                    kib = ((nr_sectors << SECTOR_SHIFT) + 1023) >> 10 or 1
                    bucket = 1 << (kib - 1).bit_length()
                    histogram[bucket] = histogram.get(bucket, 0) + 1
                bios = rq.bios
                wait = 0
                for bio in bios:
                    wait += now - bio.submit_time
                bio_wait[group] += wait
                bios_done[group] += len(bios)
            self._last_change, self.in_flight = last, in_flight
            self._weighted_ns, self._busy_ns = weighted, busy

    def add_engine_calls(self, count: int, crypto_ns: int = 0, queue_ns: float = 0.0) -> None:
        """A request's engine calls, its modelled crypto time (its calls over the engine's
        channels) and the modelled time of its dm-crypt queue hops."""
        with self._lock:
            self.engine_calls += count
            self.crypto_ns += crypto_ns
            self.queue_ns += queue_ns

    def snapshot(self) -> dict[str, Any]:
        """Counters and iostat-style averages (sizes in KiB, times in ms)."""
        with self._lock:
            now = time.perf_counter_ns()
            self._tick(now)
            elapsed_ns = max(1, now - self._reset_time)
            result: dict[str, Any] = {}
            for group in _GROUPS:
                ios = self._ios[group]
                done = self._bios_done[group]
                result[f"{group}_ios"] = ios
                result[f"{group}_bios"] = self._bios[group]
                result[f"{group}_merges"] = self._merges[group]
                result[f"{group}_sectors"] = self._sectors[group]
                result[f"{group}areq_sz"] = self._sectors[group] / 2 / ios if ios else 0.0
                result[f"{group}_await"] = self._bio_wait_ns[group] / done / 1e6 if done else 0.0
                result[f"{group}_d2c"] = self._d2c_ns[group] / ios / 1e6 if ios else 0.0
                # Cumulative totals (/proc/diskstats' rd_ticks…), so a client can take deltas.
                result[f"{group}_bios_done"] = done
                result[f"{group}_ticks_ms"] = self._bio_wait_ns[group] / 1e6
            total_ios = sum(self._ios.values())
            result.update(
                front_merges=self.front_merges,
                back_merges=self.back_merges,
                request_merges=self.request_merges,
                engine_calls=self.engine_calls,
                crypto_ms=self.crypto_ns / 1e6,
                queue_ms=self.queue_ns / 1e6,
                in_flight=self.in_flight,
                queued=self.in_flight - self.on_device,
                on_device=self.on_device,
                aqu_sz=self._weighted_ns / elapsed_ns,
                util=self._busy_ns / elapsed_ns,
                svctm=self._busy_ns / total_ios / 1e6 if total_ios else 0.0,
                io_ticks_ms=self._busy_ns / 1e6,
                time_in_queue_ms=self._weighted_ns / 1e6,
                elapsed_s=elapsed_ns / 1e9,
                request_size_histogram=dict(sorted(self.histogram.items())),
            )
            return result
