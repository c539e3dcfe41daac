"""The engine object: real bytes through ``app.crypto``, modelled time through the cost model.

Bytes and time take different roads on purpose:

- simulated hardware (``measured=False``): the bytes come from one bulk
  ``encrypt_segments`` over the whole request, the fastest path the crypto
  layer guarantees byte-identical to per-unit encryption; the time is the cost
  model applied to the planned calls. How the bytes were computed on this CPU
  says nothing about the hardware, so it need not mirror the calls.
- ``software`` (``measured=True``): every planned call is really made, one
  data unit at a time on the fallback path, a chunk at a time on the bulk
  path, and the wall time of each call is what the clock is charged. Its
  figures are measurements, not a model.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from app.engine.clock import ClockSnapshot, VirtualClock
from app.engine.cost import plan_cost
from app.engine.model import EngineProfile, SpecLike
from app.engine.planner import CallPlan, plan_calls
from app.errors import InvalidInput
from app.vocab import CipherOp, DispatchMode

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ["CryptTransformLike", "Engine", "EngineResult", "EngineStats", "SimulatedEngine"]


class CryptTransformLike(Protocol):
    """The part of ``app.crypto.transform.CryptTransform`` the engine calls."""

    @property
    def sector_size(self) -> int: ...
    @property
    def spec(self) -> SpecLike: ...
    def encrypt(self, data: Buffer, sector: int, /) -> bytes: ...
    def decrypt(self, data: Buffer, sector: int, /) -> bytes: ...
    def encrypt_segments(self, segments: Sequence[Buffer], sector: int, /) -> list[bytes]: ...
    def decrypt_segments(self, segments: Sequence[Buffer], sector: int, /) -> list[bytes]: ...
    def encrypt_into(self, data: Buffer, sector: int, out: Buffer, /) -> None: ...
    def decrypt_into(self, data: Buffer, sector: int, out: Buffer, /) -> None: ...


@dataclass(frozen=True, slots=True)
class EngineResult:
    """Outputs per input segment, the calls made, and the modelled time.

    ``modelled_ns`` is the request's own crypto time (CPU IVs + calls over the
    channels, or the measured wall time of the calls for ``software``);
    ``queue_wait_ns`` is what it waited behind other requests on the engine's
    virtual clock; ``completes_at_ns`` is its end on that clock.
    """

    outputs: list[Buffer]
    plan: CallPlan
    modelled_ns: int
    cpu_ns: int
    queue_wait_ns: int
    completes_at_ns: int

    @property
    def calls(self) -> int:
        return len(self.plan.calls)


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Live counters of one engine since it was built."""

    name: str
    requests: int
    bulk_calls: int
    unit_calls: int
    bytes_encrypted: int
    bytes_decrypted: int
    cpu_ns: int
    clock: ClockSnapshot

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "requests": self.requests,
            "calls": {"bulk": self.bulk_calls, "unit": self.unit_calls},
            "bytes": {"encrypt": self.bytes_encrypted, "decrypt": self.bytes_decrypted},
            "cpu_ns": self.cpu_ns,
            **self.clock.to_dict(),
        }


class Engine(ABC):
    """A crypto engine: takes a request's segments, returns its ciphertext/plaintext."""

    @property
    @abstractmethod
    def profile(self) -> EngineProfile: ...

    @property
    def name(self) -> str:
        return self.profile.name

    @abstractmethod
    def process(
        self,
        op: CipherOp,
        transform: CryptTransformLike,
        segments: Sequence[Buffer],
        sector: int,
        *,
        dispatch_mode: DispatchMode,
        bios: Sequence[tuple[int, int]] | None = None,
        into: Sequence[memoryview] | None = None,
    ) -> EngineResult:
        """Encrypt or decrypt ``segments`` starting at target-relative ``sector``.

        ``into``, when given, receives the output (one buffer per segment, same
        sizes) instead of fresh buffers: reads decrypt straight into the bio pages.

        ``bios`` are ``(sector, nr_sectors)`` of the bios merged into the
        request, in the same frame as ``sector``; bio mode makes one bulk call
        per bio. ``None`` means the request is a single bio.
        """

    @abstractmethod
    def snapshot(self) -> EngineStats: ...

    def check(self, spec: SpecLike, data_unit_size: int) -> None:
        """Refuse, at table load, a volume this engine could never process."""
        reason = self.profile.capabilities.unsupported_reason(spec, data_unit_size)
        if reason is not None:
            raise InvalidInput(f"engine {self.profile.name}: {reason}")


class SimulatedEngine(Engine):
    """An engine from an ``EngineProfile``; see the module docstring for bytes vs time.

    ``pacing`` (a positive factor) makes ``process`` sleep until the modelled
    completion, scaled; ``None`` never sleeps. Measured engines are never
    paced: their time was really spent.
    """

    def __init__(
        self,
        profile: EngineProfile,
        *,
        pacing: float | None = None,
        clock: VirtualClock | None = None,
    ) -> None:
        profile.validate()
        self._profile = profile
        self.pacing = None if profile.measured else pacing
        self.clock = clock or VirtualClock(
            profile.capabilities.channels, time_scale=self.pacing or 1.0
        )
        self._lock = threading.Lock()
        self._requests = 0
        self._bulk_calls = 0
        self._unit_calls = 0
        self._bytes = {"encrypt": 0, "decrypt": 0}
        self._cpu_ns = 0

    @property
    def profile(self) -> EngineProfile:
        return self._profile

    def plan(
        self,
        op: CipherOp,
        spec: SpecLike,
        segment_sizes: Sequence[int],
        sector: int,
        *,
        data_unit_size: int,
        dispatch_mode: DispatchMode,
        bios: Sequence[tuple[int, int]] | None = None,
    ) -> CallPlan:
        return plan_calls(
            self._profile.capabilities,
            spec,
            segment_sizes,
            op=op,
            data_unit_size=data_unit_size,
            dispatch_mode=dispatch_mode,
            sector=sector,
            bios=bios,
        )

    def process(
        self,
        op: CipherOp,
        transform: CryptTransformLike,
        segments: Sequence[Buffer],
        sector: int,
        *,
        dispatch_mode: DispatchMode,
        bios: Sequence[tuple[int, int]] | None = None,
        into: Sequence[memoryview] | None = None,
    ) -> EngineResult:
        views = [memoryview(segment).cast("B") for segment in segments]
        if into is not None and [len(out) for out in into] != [view.nbytes for view in views]:
            raise ValueError("output buffers must match the input segments")
        plan = self.plan(
            op,
            transform.spec,
            [view.nbytes for view in views],
            sector,
            data_unit_size=transform.sector_size,
            dispatch_mode=dispatch_mode,
            bios=bios,
        )
        ready = self.clock.now_ns()
        if self._profile.measured:
            outputs, durations = _run_calls(op, transform, views, plan, into)
            cpu_ns = 0.0
            modelled = float(sum(durations))
        else:
            convert = transform.encrypt_into if op == "encrypt" else transform.decrypt_into
            outputs = _outputs(views, into)
            position = sector
            for view, output in zip(views, outputs, strict=True):
                convert(view, position, output)
                position += view.nbytes >> 9
            cost = plan_cost(self._profile, plan)
            durations, cpu_ns, modelled = list(cost.call_ns), cost.cpu_ns, cost.latency_ns
        # Software IVs are generated before the calls can be submitted.
        reservation = self.clock.reserve(durations, ready_ns=ready + int(cpu_ns))
        self._count(plan, cpu_ns)
        if self.pacing:
            self.clock.sleep_until(reservation.end_ns)
        return EngineResult(
            outputs=outputs,
            plan=plan,
            modelled_ns=round(modelled),
            cpu_ns=round(cpu_ns),
            queue_wait_ns=reservation.wait_ns,
            completes_at_ns=reservation.end_ns,
        )

    def _count(self, plan: CallPlan, cpu_ns: float) -> None:
        with self._lock:
            self._requests += 1
            self._bulk_calls += plan.bulk_calls
            self._unit_calls += plan.unit_calls
            self._bytes[plan.op] += plan.nbytes
            self._cpu_ns += round(cpu_ns)

    def snapshot(self) -> EngineStats:
        with self._lock:
            return EngineStats(
                name=self._profile.name,
                requests=self._requests,
                bulk_calls=self._bulk_calls,
                unit_calls=self._unit_calls,
                bytes_encrypted=self._bytes["encrypt"],
                bytes_decrypted=self._bytes["decrypt"],
                cpu_ns=self._cpu_ns,
                clock=self.clock.snapshot(),
            )


def _run_calls(
    op: CipherOp,
    transform: CryptTransformLike,
    views: list[memoryview],
    plan: CallPlan,
    into: Sequence[memoryview] | None = None,
    clock_ns: Callable[[], int] = time.perf_counter_ns,
) -> tuple[list[Buffer], list[float]]:
    """Make each planned call for real; per-unit calls get exactly one data unit."""
    many: Callable[[Sequence[Buffer], int], list[bytes]] = (
        transform.encrypt_segments if op == "encrypt" else transform.decrypt_segments
    )
    outputs = _outputs(views, into)
    convert = transform.encrypt_into if op == "encrypt" else transform.decrypt_into
    if len(plan.calls) == 1 and len(views) == 1:
        # The common request: one call over one segment (a bio's buffer).
        began = clock_ns()
        convert(views[0], plan.calls[0].sector, outputs[0])
        return outputs, [float(clock_ns() - began)]
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


def _outputs(views: list[memoryview], into: Sequence[memoryview] | None) -> list[Buffer]:
    """The caller's buffers (a read lands straight in the bio's pages) or fresh ones,
    uninitialized: every byte is about to be written, zeroing would be a wasted pass."""
    if into is not None:
        return list(into)
    return [np.empty(view.nbytes, dtype=np.uint8).data for view in views]
