"""One cell of a benchmark: build or retune its volume, run the workload, measure and model.

A cell runs ``spec.warmup`` rounds it discards, then ``spec.rounds`` it keeps (the
job interleaves them across its cells: ``app.bench.jobs``); its figures are the
rounds' medians with a 95 % interval (``app.bench.stats``), the per-round figures
kept beside them so comparisons can be resampled, and ``warnings`` says when a
cell is too short or too noisy to carry a claim.

A cell's figures are either measured on this host (wall-clock MB/s, IOPS,
latency percentiles, process CPU, and the block-layer counters the queue
really produced) or modelled: the crypto time the engine's virtual clock
charged for the calls this cell made (for the measured ``software`` engine,
the calls' wall time) and what the data path's ``DeviceTimer`` charged for its
device I/O (one per dispatched request, plus flushes), combined by
``app.engine.cost.pipeline_time`` over the cell's mean request. Each field of
``CellResult`` says which it is (``FIGURE_KINDS``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from app.bench.runner import run_workload
from app.bench.spec import CellPlan, JobSpec, VolumeTemplate
from app.bench.stats import cell_warnings, median_interval
from app.blk.tuning import Tuning, TuningPatch
from app.control import Control
from app.dm.table import CryptParams
from app.dm.volume import Volume
from app.engine.cost import StageTimes, pipeline_time
from app.engine.model import EngineProfile, SpecLike
from app.engine.registry import EngineRegistry
from app.errors import InvalidInput
from app.vocab import DispatchMode

__all__ = ["FIGURE_KINDS", "CellResult", "CellRunner", "Round"]

_MEASURED = {"figure": "measured"}
_MODELLED = {"figure": "modelled"}


@dataclass(frozen=True, slots=True)
class CellResult(Mapping[str, Any]):
    """What one cell did; also a read-only mapping, for the report's pivots by axis name.

    Persisted (and served) as ``to_dict()``; ``None`` where a figure does not
    apply (no crypt target, no request to model).
    """

    n: int
    volume: str
    dispatch_mode: DispatchMode
    engine: str
    engine_measured: bool
    device_model: str
    cipher: str | None
    sector_size: int | None
    bulk_applies: bool | None
    fallback_reason: str | None
    rw: str
    bs: int
    iodepth: int
    numjobs: int
    bytes: int
    measured_mb_s: float = field(metadata=_MEASURED)
    modelled_mb_s: float | None = field(metadata=_MODELLED)
    iops: float = field(metadata=_MEASURED)
    p50_ms: float = field(metadata=_MEASURED)
    p99_ms: float = field(metadata=_MEASURED)
    cpu_s: float | None = field(metadata=_MEASURED)
    elapsed_s: float = field(metadata=_MEASURED)
    bios: int = field(metadata=_MEASURED)
    requests: int = field(metadata=_MEASURED)
    merges: int = field(metadata=_MEASURED)
    engine_calls: int = field(metadata=_MEASURED)
    bulk_calls: int = field(metadata=_MEASURED)
    unit_calls: int = field(metadata=_MEASURED)
    avg_request_kib: float = field(metadata=_MEASURED)
    request_size_histogram: dict[str, int] = field(metadata=_MEASURED)
    modelled_ms: float = field(metadata=_MODELLED)
    device_ios: int = field(metadata=_MEASURED)
    crypto_ms: float = field(metadata=_MODELLED)
    storage_ms: float = field(metadata=_MODELLED)
    modelled_basis: str
    rounds: int = 1
    coverage: float = 0.0
    measured_mb_s_low: float | None = field(default=None, metadata=_MEASURED)
    measured_mb_s_high: float | None = field(default=None, metadata=_MEASURED)
    modelled_mb_s_low: float | None = field(default=None, metadata=_MODELLED)
    modelled_mb_s_high: float | None = field(default=None, metadata=_MODELLED)
    measured_mb_s_rounds: list[float] = field(default_factory=list, metadata=_MEASURED)
    modelled_mb_s_rounds: list[float] = field(default_factory=list, metadata=_MODELLED)
    warnings: list[str] = field(default_factory=list)
    write_regime: str | None = field(default=None, metadata=_MODELLED)
    """Where the device model's write buffer had the cell's writes: ``burst``,
    ``sustained`` or ``burst+sustained`` (None: no writes, or no buffer)."""
    queue_ms: float = field(default=0.0, metadata=_MODELLED)
    """dm-crypt's queue hops, all requests' (at the engine's ``queue_hop_ns``; 0: unmodelled)."""

    def __getitem__(self, key: str) -> Any:
        if key not in _FIELD_NAMES:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(_FIELD_NAMES)

    def __len__(self) -> int:
        return len(_FIELD_NAMES)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CellResult:
        return cls(**{name: data[name] for name in _FIELD_NAMES if name in data})


_FIELD_NAMES = tuple(f.name for f in fields(CellResult))

#: What each cell figure is; persisted with every run so a reader never has to guess.
FIGURE_KINDS: dict[str, str] = {
    f.name: f.metadata["figure"] for f in fields(CellResult) if "figure" in f.metadata
}


_COUNTERS = ("ios", "bios", "merges", "sectors")


def _counter_delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, int]:
    delta = {
        "engine_calls": after["engine_calls"] - before["engine_calls"],
        "crypto_ns": round((after["crypto_ms"] - before["crypto_ms"]) * 1e6),
        "queue_ns": round((after["queue_ms"] - before["queue_ms"]) * 1e6),
    }
    for group in ("r", "w"):
        for counter in _COUNTERS:
            key = f"{group}_{counter}"
            delta[key] = after[key] - before[key]
    return delta


def _histogram_delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, int]:
    old: Mapping[int, int] = before["request_size_histogram"]
    new: Mapping[int, int] = after["request_size_histogram"]
    return {
        f"{kib}k": count - old.get(kib, 0) for kib, count in new.items() if count - old.get(kib, 0)
    }


def _crypt_params(volume: Volume) -> CryptParams | None:
    if volume.live is None:
        return None
    for line in volume.live.table.lines:
        if isinstance(line.target, CryptParams):
            return line.target
    return None


#: One round of a cell: runs its workload once (reporting bytes done), measured and modelled.
Round = Callable[[Callable[[int], None] | None], CellResult]


class CellRunner:
    """Prepares a cell's volume, runs its rounds, measures and models, sums the rounds up."""

    def __init__(self, control: Control, engines: EngineRegistry) -> None:
        self.control = control
        self.engines = engines

    @contextmanager
    def prepared(self, spec: JobSpec, plan: CellPlan, name: str) -> Iterator[Round]:
        """The cell's volume, built (template) or found (named), as a round to run at will.

        A named volume is retuned to the cell's settings before each round, since the
        job's other cells retune it between rounds, and restored on exit.
        """
        template = spec.volume_template
        if template is not None:
            assert plan.table is not None
            self.control.create_device(name, template.device_size, _model_arg(template))
            try:
                volume = self.control.create_volume(
                    name,
                    plan.table.replace("{dev}", name),
                    engine=plan.engine or "software",
                    tuning=Tuning(dispatch_mode=plan.dispatch_mode or "request"),
                )
            except BaseException:
                self.control.delete_device(name)
                raise
            try:
                yield lambda progress: self._measure(volume, plan, template.device_model, progress)
            finally:
                self.control.remove(name, force=True)
                self.control.delete_device(name)
            return
        assert spec.volume is not None
        named = spec.volume
        volume = self.control.volume(named)
        original = (volume.dispatch_mode, volume.engine.name)
        device_model = self._device_model_of(volume)

        def retuned_round(progress: Callable[[int], None] | None) -> CellResult:
            patch = TuningPatch(dispatch_mode=plan.dispatch_mode)
            self.control.retune(named, engine=plan.engine, patch=patch)
            return self._measure(volume, plan, device_model, progress)

        try:
            yield retuned_round
        finally:
            self.control.retune(
                named, engine=original[1], patch=TuningPatch(dispatch_mode=original[0])
            )

    def _device_model_of(self, volume: Volume) -> str:
        params = _crypt_params(volume)
        if params is None or params.device.kind != "device":
            return "none"
        return self.control.catalog.model_of(params.device.name) or "none"

    @staticmethod
    def summarise(spec: JobSpec, kept: Sequence[CellResult]) -> CellResult:
        """A cell's kept rounds as medians with their intervals, the rounds, and warnings.

        Counters (bios, requests, calls…) are the last round's: every round runs the
        same workload, so they are per round, not totals.
        """
        measured = median_interval([cell.measured_mb_s for cell in kept])
        modelled_rounds = [cell.modelled_mb_s for cell in kept if cell.modelled_mb_s is not None]
        modelled = median_interval(modelled_rounds) if modelled_rounds else None
        last = kept[-1]
        figure = modelled if modelled is not None and not last.engine_measured else measured
        return replace(
            last,
            measured_mb_s=round(measured.median, 3),
            modelled_mb_s=None if modelled is None else round(modelled.median, 3),
            iops=round(float(np.median([cell.iops for cell in kept])), 1),
            p50_ms=round(float(np.median([cell.p50_ms for cell in kept])), 4),
            p99_ms=round(float(np.median([cell.p99_ms for cell in kept])), 4),
            elapsed_s=round(float(np.median([cell.elapsed_s for cell in kept])), 4),
            rounds=spec.rounds,
            coverage=measured.coverage,
            measured_mb_s_low=round(measured.low, 3),
            measured_mb_s_high=round(measured.high, 3),
            modelled_mb_s_low=None if modelled is None else round(modelled.low, 3),
            modelled_mb_s_high=None if modelled is None else round(modelled.high, 3),
            measured_mb_s_rounds=[cell.measured_mb_s for cell in kept],
            modelled_mb_s_rounds=modelled_rounds,
            warnings=cell_warnings(
                figure,
                float(np.median([cell.elapsed_s for cell in kept])),
                measured=figure is measured,
            ),
        )

    def _measure(
        self,
        volume: Volume,
        plan: CellPlan,
        device_model: str,
        progress: Callable[[int], None] | None,
    ) -> CellResult:
        workload = plan.workload
        if workload.span > volume.size:
            raise InvalidInput(
                f"the workload touches {workload.span} bytes; volume {volume.name} has {volume.size}"
            )
        engine = volume.engine
        profile: EngineProfile = engine.profile
        timer = self.engines.device_timer(device_model)
        timer.settle()
        stats_before = volume.stats.snapshot()
        engine_before = engine.snapshot()
        timer_before = timer.snapshot()
        result = run_workload(volume, workload, progress=progress)
        engine_after = engine.snapshot()
        timer_after = timer.snapshot()
        stats_after = volume.stats.snapshot()
        counters = _counter_delta(stats_before, stats_after)
        n_requests = counters["r_ios"] + counters["w_ios"]
        device_ios = sum(timer_after["ios"].values()) - sum(timer_before["ios"].values())
        storage_ns = timer_after["busy_ns"] - timer_before["busy_ns"]
        regimes = [
            regime
            for regime, nbytes in timer_after["write_bytes_by_regime"].items()
            if nbytes > timer_before["write_bytes_by_regime"][regime]
        ]
        engine_busy_ns = engine_after.clock.busy_ns - engine_before.clock.busy_ns
        engine_cpu_ns = engine_after.cpu_ns - engine_before.cpu_ns
        # Each request's own crypto time: its CPU IVs, then its calls over the channels.
        crypto_ns = counters["crypto_ns"]
        model = pipeline_time(
            StageTimes.mean(
                n_requests,
                storage_ns=storage_ns,
                cpu_ns=engine_cpu_ns,
                engine_busy_ns=engine_busy_ns,
                crypto_ns=crypto_ns,
                calls=counters["engine_calls"],
                queue_ns=counters["queue_ns"],
            ),
            count=n_requests,
            queue_depth=workload.concurrency,
            channels=profile.capabilities.channels,
        )
        params = _crypt_params(volume)
        spec_like: SpecLike | None = params.cipher if params is not None else None
        return CellResult(
            n=plan.index,
            volume=volume.name,
            dispatch_mode=volume.dispatch_mode,
            engine=profile.name,
            engine_measured=profile.measured,
            device_model=device_model,
            cipher=str(spec_like) if params is not None else None,
            sector_size=params.sector_size if params is not None else None,
            bulk_applies=(
                profile.capabilities.derives_iv(spec_like) if spec_like is not None else None
            ),
            fallback_reason=(
                profile.capabilities.fallback_reason(spec_like) if spec_like is not None else None
            ),
            rw=workload.rw,
            bs=workload.bs,
            iodepth=workload.iodepth,
            numjobs=workload.numjobs,
            bytes=result.nbytes,
            measured_mb_s=round(result.mb_s, 3),
            modelled_mb_s=(
                round(result.nbytes / model.total_ns * 1e3, 3) if model.total_ns else None
            ),
            iops=round(result.iops, 1),
            p50_ms=round(result.percentile_ms(50), 4),
            p99_ms=round(result.percentile_ms(99), 4),
            cpu_s=None if result.cpu_s is None else round(result.cpu_s, 4),
            elapsed_s=round(result.elapsed_s, 4),
            bios=counters["r_bios"] + counters["w_bios"],
            requests=n_requests,
            merges=counters["r_merges"] + counters["w_merges"],
            engine_calls=counters["engine_calls"],
            bulk_calls=engine_after.bulk_calls - engine_before.bulk_calls,
            unit_calls=engine_after.unit_calls - engine_before.unit_calls,
            avg_request_kib=(
                round((counters["r_sectors"] + counters["w_sectors"]) / 2 / n_requests, 1)
                if n_requests
                else 0.0
            ),
            request_size_histogram=_histogram_delta(stats_before, stats_after),
            modelled_ms=round(model.total_ns / 1e6, 3),
            device_ios=device_ios,
            crypto_ms=round(crypto_ns / 1e6, 3),
            queue_ms=round(counters["queue_ns"] / 1e6, 3),
            storage_ms=round(storage_ns / 1e6, 3),
            modelled_basis=(
                (
                    "software engine: measured call times"
                    if profile.measured
                    else "engine virtual clock (cost model over this cell's calls)"
                )
                + f"; storage: the data path's {device_model} device timer"
            ),
            write_regime="+".join(regimes) or None,
        )


def _model_arg(template: VolumeTemplate) -> str | None:
    return None if template.device_model == "none" else template.device_model
