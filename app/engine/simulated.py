"""The engine object: real bytes through ``app.crypto``, modelled time through the cost model.

Bytes and time take different roads on purpose:

- simulated hardware (``measured=False``): the bytes come from
  ``EngineRequest.convert``, the fastest path the crypto layer guarantees
  byte-identical to per-unit encryption; the time is the cost model applied
  to the planned calls. How the bytes were computed on this CPU
  says nothing about the hardware, so it need not mirror the calls.
- ``software`` (``measured=True``): every planned call is really made, one
  data unit at a time on the fallback path, a chunk at a time on the bulk
  path, and the wall time of each call is what the clock is charged. Its
  figures are measurements, not a model.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import TYPE_CHECKING

from app.engine import _model, accel
from app.engine.base import Engine, EngineRequest, EngineResult, EngineStats
from app.engine.clock import Clocking, Paced
from app.engine.cost import plan_cost
from app.engine.model import EngineProfile
from app.engine.planner import CallPlan

if TYPE_CHECKING:
    from typing_extensions import Buffer, Unpack

__all__ = ["EngineCounters", "SimulatedEngine"]


class EngineCounters:
    """An engine's per-request statistics: the reference of ``app.engine._model.Counters``.

    ``totals`` are (requests, bulk calls, unit calls, bytes encrypted, bytes decrypted,
    CPU IV ns).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests = 0
        self._bulk_calls = 0
        self._unit_calls = 0
        self._bytes = {"encrypt": 0, "decrypt": 0}
        self._cpu_ns = 0

    def count(self, plan: CallPlan, cpu_ns: float) -> None:
        calls = len(plan.calls)
        bulk = plan.fallback_reason is None  # plan.bulk, without a property call per request
        with self._lock:
            self._requests += 1
            if bulk:
                self._bulk_calls += calls
            else:
                self._unit_calls += calls
            self._bytes[plan.op] += plan.nbytes
            self._cpu_ns += round(cpu_ns)

    def totals(self) -> tuple[int, int, int, int, int, int]:
        with self._lock:
            return (
                self._requests,
                self._bulk_calls,
                self._unit_calls,
                self._bytes["encrypt"],
                self._bytes["decrypt"],
                self._cpu_ns,
            )


class SimulatedEngine(Engine, Paced):
    """An engine from an ``EngineProfile``; see the module docstring for bytes vs time.

    ``pacing`` (a positive factor) makes ``process`` sleep until the modelled
    completion, scaled; ``None`` never sleeps. Measured engines are never
    paced: their time was really spent.
    """

    def __init__(self, profile: EngineProfile, **clocking: Unpack[Clocking]) -> None:
        profile.validate()
        if profile.measured:
            clocking["pacing"] = None
        super().__init__(profile.capabilities.channels, **clocking)
        self._profile = profile
        self._counters: EngineCounters | _model.Counters = (
            EngineCounters if accel.reference else _model.Counters
        )()

    @property
    def profile(self) -> EngineProfile:
        return self._profile

    @property
    def paced(self) -> bool:
        return bool(self.pacing)

    def busy_for(self) -> float:
        return self.clock.busy_for()

    def process(self, request: EngineRequest) -> EngineResult:
        views = request.views()
        plan = request.plan(self._profile.capabilities, views)
        ready = self.clock.now_ns()
        if self._profile.measured:
            calls = plan.calls
            if len(calls) == 1 and len(views) == 1:
                # One call over one segment (a lone bio): no slicing into call pieces.
                outputs = request.outputs(views)
                transform = request.transform
                convert = (
                    transform.encrypt_into if request.op == "encrypt" else transform.decrypt_into
                )
                began = time.perf_counter_ns()
                convert(views[0], calls[0].sector, outputs[0])
                durations = [float(time.perf_counter_ns() - began)]
            else:
                outputs, durations = _run_calls(request, views, plan)
            cpu_ns = 0.0
            modelled = float(sum(durations))
        else:
            outputs = request.outputs(views)
            request.convert(views, outputs)
            cost = plan_cost(self._profile, plan)
            durations, cpu_ns, modelled = list(cost.call_ns), cost.cpu_ns, cost.latency_ns
        # Software IVs are generated before the calls can be submitted.
        reservation = self.clock.reserve(durations, ready_ns=ready + int(cpu_ns))
        self._counters.count(plan, cpu_ns)
        if self.pacing:
            self._pace(reservation)
        # Positional: keywords would make the class call build and unpack a dict.
        return EngineResult(
            outputs,
            plan,
            round(modelled),
            round(cpu_ns),
            reservation.start_ns - reservation.ready_ns,  # wait_ns, inline
            reservation.end_ns,
        )

    def snapshot(self) -> EngineStats:
        requests, bulk_calls, unit_calls, encrypted, decrypted, cpu_ns = self._counters.totals()
        return EngineStats(
            name=self._profile.name,
            requests=requests,
            bulk_calls=bulk_calls,
            unit_calls=unit_calls,
            bytes_encrypted=encrypted,
            bytes_decrypted=decrypted,
            cpu_ns=cpu_ns,
            clock=self.clock.snapshot(),
        )


def _run_calls(
    request: EngineRequest,
    views: list[memoryview],
    plan: CallPlan,
    clock_ns: Callable[[], int] = time.perf_counter_ns,
) -> tuple[list[Buffer], list[float]]:
    """Make each planned call for real; per-unit calls get exactly one data unit."""
    transform = request.transform
    encrypt = request.op == "encrypt"
    outputs = request.outputs(views)
    convert = transform.encrypt_into if encrypt else transform.decrypt_into
    many: Callable[[Sequence[Buffer], int], list[bytes]] = (
        transform.encrypt_segments if encrypt else transform.decrypt_segments
    )
    ends = list(accumulate(view.nbytes for view in views))
    starts = [0, *ends[:-1]]
    durations: list[float] = []
    for call in plan.calls:
        call_end = call.offset + call.nbytes
        first = bisect_right(ends, call.offset)
        places = []
        for index in range(first, first + call.nr_segments):
            low = max(call.offset, starts[index]) - starts[index]
            high = min(call_end, ends[index]) - starts[index]
            places.append((index, low, high))
        pieces = [views[index][low:high] for index, low, high in places]
        began = clock_ns()
        if len(pieces) == 1:
            index, low, high = places[0]
            convert(pieces[0], call.sector, memoryview(outputs[index])[low:high])
            durations.append(float(clock_ns() - began))
            continue
        results = many(pieces, call.sector)
        durations.append(float(clock_ns() - began))
        for (index, low, high), result in zip(places, results, strict=True):
            memoryview(outputs[index])[low:high] = result
    return outputs, durations
