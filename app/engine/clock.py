"""Virtual time: one clock per engine and per device model, thread-safe.

A clock has ``lanes`` (engine channels; 1 for a device) that are each busy
until some virtual instant. Work arriving at virtual ``now`` starts on the
earliest-free lane, so when the modelled hardware is slower than the real
arrivals a backlog builds and shows up as queue wait, exactly what the
hardware would have queued.

Virtual time is anchored to the wall clock: ``now = wall_since_epoch /
time_scale``. Without pacing ``time_scale`` is 1 and nobody sleeps. With a
pacing factor ``f`` the clock runs ``1/f`` times faster than the wall and the
caller sleeps until ``epoch + end * f``, so an HTTP client feels the hardware
(scaled by ``f``), contention included.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypedDict

from typing_extensions import Unpack

from app.engine import _model, accel
from app.engine.model import DeviceModel, DeviceOp
from app.errors import InvalidInput

__all__ = [
    "ClockSnapshot",
    "Clocking",
    "DeviceState",
    "DeviceTimer",
    "LaneHeap",
    "Paced",
    "Reservation",
    "VirtualClock",
]


@dataclass(frozen=True, slots=True)
class Reservation:
    """Where one piece of work landed on a clock (virtual ns since the clock's epoch)."""

    ready_ns: int
    start_ns: int
    end_ns: int
    busy_ns: int

    @property
    def wait_ns(self) -> int:
        """Queue wait: ready but every lane busy."""
        return self.start_ns - self.ready_ns

    @property
    def elapsed_ns(self) -> int:
        return self.end_ns - self.ready_ns


@dataclass(frozen=True, slots=True)
class ClockSnapshot:
    lanes: int
    reservations: int
    busy_ns: int
    queue_wait_ns: int
    max_queue_wait_ns: int
    span_ns: int
    """Virtual time from the first start to the last end (0 before any work)."""
    now_ns: int

    @property
    def utilization_virtual(self) -> float:
        """Busy share of the virtual span from first start to last end (<= 1)."""
        span = self.span_ns
        return self.busy_ns / (span * self.lanes) if span else 0.0

    @property
    def utilization_wall(self) -> float:
        """Busy share of the (scaled) wall time since the epoch; > 1 means a growing backlog."""
        return self.busy_ns / (self.now_ns * self.lanes) if self.now_ns > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "utilization_virtual": self.utilization_virtual,
            "utilization_wall": self.utilization_wall,
        }


class LaneHeap:
    """A clock's lanes and totals: the reference of ``app.engine._model.Lanes``.

    ``reserve`` places ``durations`` (ns, in order) on the earliest-free lanes from
    ``ready_ns``; ``totals`` are (reservations, busy, wait, max wait, first start, last end).
    """

    def __init__(self, lanes: int, reservation: type[Reservation] = Reservation) -> None:
        self.lanes = lanes
        self._reservation = reservation
        self._lock = threading.Lock()
        self._free = [0.0] * lanes  # a heap of lane free times
        self._reservations = 0
        self._busy = 0.0
        self._wait = 0
        self._max_wait = 0
        self._first_start: int | None = None
        self._last_end = 0

    def reserve(self, durations: Sequence[float], ready: int) -> Reservation:
        busy = float(sum(durations))
        with self._lock:
            free = self._free
            if self.lanes == 1 or not durations:
                start = max(float(ready), free[0])
                end = start + busy
                free[0] = end if self.lanes == 1 else free[0]
            else:
                start, end = float("inf"), 0.0
                for duration in durations:
                    begin = max(float(ready), free[0])
                    finish = begin + duration
                    heapq.heapreplace(free, finish)
                    start = min(start, begin)
                    end = max(end, finish)
            reservation = self._reservation(ready, round(start), round(end), round(busy))
            self._reservations += 1
            self._busy += busy
            wait = reservation.wait_ns
            self._wait += wait
            self._max_wait = max(self._max_wait, wait)
            if self._first_start is None:
                self._first_start = reservation.start_ns
            self._last_end = max(self._last_end, reservation.end_ns)
        return reservation

    def totals(self) -> tuple[int, float, int, int, int | None, int]:
        with self._lock:
            return (
                self._reservations,
                self._busy,
                self._wait,
                self._max_wait,
                self._first_start,
                self._last_end,
            )


class VirtualClock:
    """Lanes busy until virtual instants; ``reserve`` places work, ``sleep_until`` paces.

    The lanes are C (``app.engine._model.Lanes``) unless ``accel`` asks for the reference.
    """

    def __init__(
        self,
        lanes: int = 1,
        *,
        time_scale: float = 1.0,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if lanes < 1:
            raise InvalidInput("a clock needs at least one lane")
        if not time_scale > 0:
            raise InvalidInput("time_scale (pacing factor) must be positive")
        self.lanes = lanes
        self.time_scale = time_scale
        self._monotonic_ns = monotonic_ns
        self._sleep = sleep
        self._epoch = monotonic_ns()
        self._lanes: LaneHeap | _model.Lanes = (LaneHeap if accel.reference else _model.Lanes)(
            lanes, Reservation
        )

    def now_ns(self) -> int:
        return int((self._monotonic_ns() - self._epoch) / self.time_scale)

    def reserve(self, durations: Sequence[float], *, ready_ns: int | None = None) -> Reservation:
        """Place ``durations`` (ns, in order) on the earliest-free lanes from ``ready_ns``.

        ``ready_ns`` defaults to virtual now; pass it to replay a trace or to
        chain stages (a write's storage is ready when its crypto ends).
        """
        return self._lanes.reserve(durations, self.now_ns() if ready_ns is None else ready_ns)

    def sleep_until(self, virtual_ns: int) -> float:
        """Sleep until the wall clock reaches ``virtual_ns`` (scaled); returns seconds slept."""
        target = self._epoch + virtual_ns * self.time_scale
        delay = (target - self._monotonic_ns()) / 1e9
        if delay > 0:
            self._sleep(delay)
            return delay
        return 0.0

    def busy_for(self) -> float:
        """Wall seconds until the last work placed ends (0: idle), backlog included."""
        last_end = self._lanes.totals()[5]
        return max(0.0, (last_end - self.now_ns()) * self.time_scale / 1e9)

    def snapshot(self) -> ClockSnapshot:
        reservations, busy, wait, max_wait, first_start, last_end = self._lanes.totals()
        return ClockSnapshot(
            lanes=self.lanes,
            reservations=reservations,
            busy_ns=round(busy),
            queue_wait_ns=wait,
            max_queue_wait_ns=max_wait,
            span_ns=0 if first_start is None else last_end - first_start,
            now_ns=self.now_ns(),
        )


class Clocking(TypedDict, total=False):
    """How a ``Paced`` keeps time: ``pacing`` (a positive factor: sleep until the
    modelled completion, scaled; None never sleeps) and a ``clock`` to use instead of
    its own."""

    pacing: float | None
    clock: VirtualClock | None


class Paced:
    """Work placed on a virtual clock of ``lanes``; with ``pacing`` the caller then sleeps
    until the work's modelled end."""

    def __init__(
        self, lanes: int, *, pacing: float | None = None, clock: VirtualClock | None = None
    ) -> None:
        self.pacing = pacing
        self.clock = clock or VirtualClock(lanes, time_scale=pacing or 1.0)
        self._lock = threading.Lock()

    def _pace(self, reservation: Reservation) -> None:
        if self.pacing:
            self.clock.sleep_until(reservation.end_ns)


@dataclass(slots=True)
class DeviceState:
    """What a device model carries from one I/O to the next: when it is busy until, and
    its write buffer's fill level (see ``DeviceModel``); not thread-safe."""

    model: DeviceModel
    busy_until: float = 0.0
    buffered: float = 0.0
    burst_bytes: int = 0
    sustained_bytes: int = 0

    def buffered_write_ns(self, nbytes: int, start_ns: float) -> float:
        """A write started at ``start_ns``: the idle time before it drains the buffer at
        the sustained rate, then ``nbytes`` go in, at the burst rate while there is room."""
        model = self.model
        capacity = float(model.write_buffer_bytes or 0)
        sustained = model.write_sustained_bytes_per_s or 0.0
        idle = max(0.0, start_ns - self.busy_until)
        self.buffered = max(0.0, self.buffered - idle * sustained / 1e9)
        burst = int(min(nbytes, max(0.0, capacity - self.buffered)))
        self.buffered = min(capacity, self.buffered + nbytes)
        self.burst_bytes += burst
        self.sustained_bytes += nbytes - burst
        return model.write_ns(nbytes, burst)


class DeviceTimer(Paced):
    """A device model's clock: one I/O at a time, optional pacing, per-op counters.

    A model with a write buffer keeps its fill level: writes take the burst rate
    while it has room, the sustained rate once full, and the virtual time the
    device spends idle drains it at the sustained rate.
    """

    def __init__(self, model: DeviceModel, **clocking: Unpack[Clocking]) -> None:
        super().__init__(1, **clocking)
        self.model = model
        self._ios: dict[str, int] = {"read": 0, "write": 0, "flush": 0}
        self._bytes: dict[str, int] = {"read": 0, "write": 0, "flush": 0}
        self._state = DeviceState(model)

    def account(self, op: DeviceOp, nbytes: int, *, ready_ns: int | None = None) -> Reservation:
        """Charge one I/O to the device's virtual clock; sleeps if pacing."""
        model = self.model
        with self._lock:
            state = self._state
            if op == "write" and model.buffered:
                start = self.clock.now_ns() if ready_ns is None else ready_ns
                duration = state.buffered_write_ns(nbytes, start)
            else:
                duration = model.io_ns(op, nbytes)
            reservation = self.clock.reserve([duration], ready_ns=ready_ns)
            state.busy_until = max(state.busy_until, reservation.end_ns)
            self._ios[op] += 1
            self._bytes[op] += nbytes
        self._pace(reservation)
        return reservation

    def settle(self) -> None:
        """Empty the write buffer, as a pause long enough to drain it would (between
        benchmark cells: each starts from an idle device, whatever ran before)."""
        with self._lock:
            self._state.buffered = 0.0

    def snapshot(self) -> dict[str, Any]:
        clock = self.clock.snapshot().to_dict()
        with self._lock:
            ios, nbytes = dict(self._ios), dict(self._bytes)
            regimes = {"burst": self._state.burst_bytes, "sustained": self._state.sustained_bytes}
        return {
            "model": self.model.name,
            "ios": ios,
            "bytes": nbytes,
            "write_bytes_by_regime": regimes,
            **clock,
        }
