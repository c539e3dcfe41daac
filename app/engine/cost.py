"""Modelled time: of one planned request, and of a whole workload end to end.

Pure arithmetic over frozen dataclasses, so fits, predictions and tests need
no clock and no bytes. One request's crypto is the CPU's software IVs, then
its calls list-scheduled over the engine's channels. A workload of identical
I/Os is a pipeline of three resources (CPU, engine, device, each one at a time
except the engine's channels):

- ``queue_depth == 1`` (direct-I/O dd): storage and crypto in series, so
  ``count * (storage + crypto)``;
- ``queue_depth > 1``: crypto of one request overlaps storage of another, so
  after the first I/O each further one costs the bottleneck stage's period
  ``max(storage, cpu, engine_busy / parallel, queue / min(channels, queue_depth))``,
  ``parallel`` being how many calls can be on distinct channels at once:
  ``min(channels, queue_depth * calls)``, since an engine only overlaps the calls
  that are in flight.

dm-crypt's queue hops (``app.engine.kcryptd``, priced by the profile's
``queue_hop_ns``) add to each request's latency; queued I/Os overlap them, each hop
a thread's time on one of the engine's channels (a CPU engine's channels are its
CPUs), so they bound the period only when they outweigh every other stage.

``pipeline_time`` is that rule, the only copy: ``predict_workload`` feeds it
modelled I/Os, the benchmark cells the means of what a run really did.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from app.engine.kcryptd import STOCK, Completion, QueueFlags, crypt_path
from app.engine.model import DeviceModel, EngineProfile, ModelSpec, SpecLike
from app.engine.planner import CallPlan, plan_calls
from app.errors import InvalidInput
from app.vocab import SECTOR_SIZE, CipherOp, DispatchMode

__all__ = [
    "ModelledWorkload",
    "PipelineTime",
    "PlanCost",
    "Prediction",
    "StageTimes",
    "makespan_ns",
    "pipeline_time",
    "plan_cost",
    "predict_workload",
]


@dataclass(frozen=True, slots=True)
class PlanCost:
    """Modelled cost of one ``CallPlan``; ``call_ns`` feeds the engine's virtual clock."""

    call_ns: tuple[float, ...]
    cpu_ns: float
    makespan_ns: float

    @property
    def engine_busy_ns(self) -> float:
        """Engine time of every call, whichever channel ran it."""
        return float(sum(self.call_ns))

    @property
    def latency_ns(self) -> float:
        """Crypto time of the request alone: CPU IVs, then the calls over the channels."""
        return self.cpu_ns + self.makespan_ns


def makespan_ns(durations: Sequence[float], channels: int) -> float:
    """Finish time of ``durations`` started in order on the earliest-free of ``channels``."""
    if channels == 1 or len(durations) <= 1:
        return float(sum(durations))
    lanes = [0.0] * min(channels, len(durations))
    for duration in durations:
        heapq.heapreplace(lanes, lanes[0] + duration)
    return max(lanes)


def plan_cost(profile: EngineProfile, plan: CallPlan) -> PlanCost:
    cost = profile.cost
    call_ns = tuple(cost.call_ns(plan.op, call.nbytes, call.nr_segments) for call in plan.calls)
    return PlanCost(
        call_ns=call_ns,
        cpu_ns=plan.cpu_iv_units * profile.cpu_iv_ns,
        makespan_ns=makespan_ns(call_ns, profile.capabilities.channels),
    )


@dataclass(frozen=True, slots=True)
class StageTimes:
    """One I/O's time in each pipeline stage; ``crypto_ns`` is its CPU IVs plus calls' makespan,
    ``queue_ns`` its dm-crypt queue hops."""

    storage_ns: float
    cpu_ns: float
    engine_busy_ns: float
    crypto_ns: float
    calls: float
    queue_ns: float = 0.0

    @classmethod
    def mean(
        cls,
        items: int,
        *,
        storage_ns: float,
        cpu_ns: float,
        engine_busy_ns: float,
        crypto_ns: float,
        calls: float,
        queue_ns: float = 0.0,
    ) -> StageTimes:
        """The per-item mean of totals measured over ``items`` I/Os (all zero for none)."""
        share = 1 / items if items else 0.0
        return cls(
            storage_ns * share,
            cpu_ns * share,
            engine_busy_ns * share,
            crypto_ns * share,
            calls * share,
            queue_ns * share,
        )


@dataclass(frozen=True, slots=True)
class PipelineTime:
    """``latency_ns``: one I/O alone; ``period_ns``: each further one; ``total_ns``: all."""

    latency_ns: float
    period_ns: float
    total_ns: float


def pipeline_time(
    stages: StageTimes, *, count: int, queue_depth: int, channels: int
) -> PipelineTime:
    """``count`` I/Os like ``stages`` with ``queue_depth`` in flight (the module docstring's rule)."""
    latency = stages.storage_ns + stages.crypto_ns + stages.queue_ns
    if queue_depth <= 1:
        period = latency
    else:
        parallel = max(1.0, min(channels, queue_depth * max(stages.calls, 1.0)))
        period = max(
            stages.storage_ns,
            stages.cpu_ns,
            stages.engine_busy_ns / parallel,
            stages.queue_ns / min(channels, queue_depth),
        )
    total = latency + (count - 1) * period if count > 0 else 0.0
    return PipelineTime(latency, period, total)


@dataclass(frozen=True, slots=True)
class ModelledWorkload:
    """``count`` sequential I/Os of ``io_bytes``, dd/fio style.

    Each I/O's user buffer gives ``segment_bytes`` segments (4 KiB pages). In
    request mode an I/O larger than ``max_request_bytes`` (max_sectors_kb)
    becomes several requests, each one storage I/O; in bio mode it is one bio.
    ``encrypted=False`` models the raw device. Each request (bio mode: each bio) takes
    the hops ``queue_flags`` leave on dm-crypt's path, at the profile's ``queue_hop_ns``.
    """

    op: Literal["read", "write"]
    io_bytes: int
    count: int = 1
    queue_depth: int = 1
    dispatch_mode: DispatchMode = "request"
    data_unit_size: int = 512
    segment_bytes: int = 4096
    max_request_bytes: int = 1280 * 1024
    encrypted: bool = True
    queue_flags: QueueFlags = STOCK
    """The crypt target's queue flags: which of dm-crypt's hops each request takes."""
    split_bytes: int | None = None
    """dm-crypt's split for this direction (max_read_size / max_write_size): an engine
    call's cap below the engine's own; None: no split."""

    def validate(self) -> None:
        if self.io_bytes <= 0 or self.io_bytes % self.data_unit_size:
            raise InvalidInput("io_bytes must be a positive multiple of the data unit size")
        if self.count < 1 or self.queue_depth < 1 or self.segment_bytes < SECTOR_SIZE:
            raise InvalidInput("count and queue_depth must be >= 1, segment_bytes >= 512")
        if self.max_request_bytes < self.data_unit_size:
            raise InvalidInput("max_request_bytes must hold at least one data unit")


@dataclass(frozen=True, slots=True)
class Prediction:
    """Modelled times for a workload; all ``*_ns`` except ``total_ns`` are per I/O."""

    workload: ModelledWorkload
    storage_ns: float
    cpu_ns: float
    engine_busy_ns: float
    crypto_ns: float
    latency_ns: float
    period_ns: float
    total_ns: float
    calls_per_io: int
    bulk: bool
    queue_ns: float = 0.0
    """dm-crypt's queue hops per I/O."""
    burst_share: float = 1.0
    """Share of the written bytes the device took at its burst rate (1 without a buffer)."""

    @property
    def mb_per_s(self) -> float:
        """Decimal MB/s, as dd prints it."""
        return self.workload.io_bytes * self.workload.count / self.total_ns * 1e3


def _segments(nbytes: int, segment_bytes: int) -> list[int]:
    full, rest = divmod(nbytes, segment_bytes)
    return [segment_bytes] * full + ([rest] if rest else [])


def predict_workload(
    profile: EngineProfile | None,
    device: DeviceModel,
    workload: ModelledWorkload,
    spec: SpecLike | None = None,
) -> Prediction:
    """End-to-end modelled time of ``workload``; ``profile=None`` is the raw device."""
    workload.validate()
    spec = spec if spec is not None else ModelSpec()
    op: CipherOp = "decrypt" if workload.op == "read" else "encrypt"
    if workload.dispatch_mode == "bio":
        requests = [workload.io_bytes]
    else:
        step = workload.max_request_bytes // workload.data_unit_size * workload.data_unit_size
        requests = _segments(workload.io_bytes, step)
    storage = cpu = busy = crypto = queue = 0.0
    calls = 0
    hop_ns = profile.queue_hop_ns if profile is not None and workload.encrypted else 0.0
    hops = len(crypt_path(workload.op, workload.queue_flags, Completion()).hops) if hop_ns else 0
    bulk = True
    sector = 0
    share = 1.0
    if workload.op == "write":
        # A back-to-back stream from idle: the buffer's bytes at the burst rate, then the
        # sustained rate; each I/O is charged the stream's mean (exact in series, qd 1).
        share = device.stream_burst_share(workload.io_bytes * workload.count)
    for nbytes in requests:
        if workload.op == "write":
            storage += device.write_ns(nbytes, nbytes * share)
        else:
            storage += device.io_ns(workload.op, nbytes)
        if profile is None or not workload.encrypted:
            continue
        plan = plan_calls(
            profile.capabilities.capped(workload.split_bytes),
            spec,
            _segments(nbytes, workload.segment_bytes),
            op=op,
            data_unit_size=workload.data_unit_size,
            dispatch_mode=workload.dispatch_mode,
            sector=sector,
        )
        sector += nbytes // SECTOR_SIZE
        cost = plan_cost(profile, plan)
        queue += hops * hop_ns
        cpu += cost.cpu_ns
        busy += cost.engine_busy_ns
        crypto += cost.latency_ns
        calls += len(plan.calls)
        bulk = bulk and plan.bulk
    pipeline = pipeline_time(
        StageTimes(storage, cpu, busy, crypto, calls, queue),
        count=workload.count,
        queue_depth=workload.queue_depth,
        channels=profile.capabilities.channels if profile is not None else 1,
    )
    return Prediction(
        workload=workload,
        storage_ns=storage,
        cpu_ns=cpu,
        engine_busy_ns=busy,
        crypto_ns=crypto,
        latency_ns=pipeline.latency_ns,
        period_ns=pipeline.period_ns,
        total_ns=pipeline.total_ns,
        calls_per_io=calls,
        bulk=bulk and calls > 0,
        queue_ns=queue,
        burst_share=share,
    )
