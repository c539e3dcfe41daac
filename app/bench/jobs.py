"""Benchmark jobs: a spec, its sweep of cells, running them, persisting ``BenchmarkRun`` rows.

A job runs on one background worker thread, cells one after another, so cells
never compete with each other for the CPU or for an engine's virtual clock.
Progress lives in memory (fine-grained, for GET) and is written to SQL after
every cell and at the end, so a finished run survives a restart and an
unfinished one is marked failed on the next start.

Measured vs modelled (see ``docs/benchmarks.md``):

- measured: wall-clock MB/s, IOPS, latency percentiles and process CPU of the
  run on this host, and the block-layer counters (bios, requests, merges,
  engine calls) the volume's queue really produced;
- modelled: the crypto time the engine's virtual clock charged for the calls
  this cell made (for the measured ``software`` engine: the calls' wall time),
  plus what the data path's ``DeviceTimer`` charged for the device I/O this
  cell made (one per dispatched request, plus flushes), combined with
  ``app.engine.cost``'s pipeline rule (in series at queue depth 1, overlapped
  at the bottleneck otherwise).
"""

from __future__ import annotations

import itertools
import logging
import os
import platform
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.bench.runner import run_workload
from app.bench.workload import RW_MODES, Workload, parse_size
from app.blk.tuning import Tuning, TuningPatch
from app.control import Control
from app.db import models
from app.dm.table import CryptParams, parse_table, redact
from app.dm.volume import Volume
from app.engine.model import EngineProfile, SpecLike
from app.engine.registry import EngineRegistry
from app.errors import BenchmarkNotFound, InvalidInput, ReqcryptError
from app.vocab import DISPATCH_MODES

log = logging.getLogger("reqcrypt.bench")

SWEEP_AXES = ("engine", "table", "dispatch_mode", "rw", "bs", "iodepth", "numjobs")
MAX_CELLS = 256
MAX_DEVICE_BYTES = 16 << 30
MEASURED = "measured"
MODELLED = "modelled"

#: What each cell figure is; persisted with every run so a reader never has to guess.
FIGURE_KINDS: dict[str, str] = {
    "measured_mb_s": MEASURED,
    "iops": MEASURED,
    "p50_ms": MEASURED,
    "p99_ms": MEASURED,
    "cpu_s": MEASURED,
    "elapsed_s": MEASURED,
    "bios": MEASURED,
    "requests": MEASURED,
    "merges": MEASURED,
    "engine_calls": MEASURED,
    "request_size_histogram": MEASURED,
    "modelled_mb_s": MODELLED,
    "modelled_ms": MODELLED,
    "crypto_ms": MODELLED,
    "storage_ms": MODELLED,
    "device_ios": MEASURED,
}


# ---------------------------------------------------------------------- spec


@dataclass(frozen=True, slots=True)
class VolumeTemplate:
    """A table with ``{dev}`` for a fresh device of ``device_size`` bytes and ``device_model``."""

    table: str
    device_size: int
    device_model: str = "none"


@dataclass(frozen=True, slots=True)
class JobSpec:
    volume: str | None
    volume_template: VolumeTemplate | None
    engine: str | None
    workload: Workload
    sweep: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    label: str = ""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        known = {"volume", "volume_template", "engine", "workload", "sweep", "label"}
        unknown = set(data) - known
        if unknown:
            raise InvalidInput(f"benchmark: unknown field(s) {', '.join(sorted(unknown))}")
        volume = data.get("volume")
        raw_template = data.get("volume_template")
        if (volume is None) == (raw_template is None):
            raise InvalidInput("give exactly one of volume or volume_template")
        template = None
        if raw_template is not None:
            if not isinstance(raw_template, Mapping) or not isinstance(
                raw_template.get("table"), str
            ):
                raise InvalidInput("volume_template needs a table with {dev} for the device")
            template = VolumeTemplate(
                table=raw_template["table"],
                device_size=parse_size(raw_template.get("device_size", 64 << 20)),
                device_model=str(raw_template.get("device_model") or "none"),
            )
            if "{dev}" not in template.table:
                raise InvalidInput("volume_template.table must name the device as {dev}")
            if not 0 < template.device_size <= MAX_DEVICE_BYTES or template.device_size % 512:
                raise InvalidInput("device_size must be a multiple of 512, at most 16 GiB")
        sweep = dict(data.get("sweep") or {})
        for axis, values in sweep.items():
            if axis not in SWEEP_AXES:
                raise InvalidInput(f"sweep: unknown axis {axis!r} (axes: {', '.join(SWEEP_AXES)})")
            if not isinstance(values, list | tuple) or not values:
                raise InvalidInput(f"sweep.{axis} must be a non-empty list")
        if "table" in sweep and template is None:
            raise InvalidInput("sweep.table needs a volume_template")
        for mode in sweep.get("dispatch_mode", []):
            if mode not in DISPATCH_MODES:
                raise InvalidInput("sweep.dispatch_mode values are bio and request")
        for rw in sweep.get("rw", []):
            if rw not in RW_MODES:
                raise InvalidInput(f"sweep.rw values are {', '.join(RW_MODES)}")
        sweep = {
            axis: [parse_size(v) for v in values] if axis == "bs" else list(values)
            for axis, values in sweep.items()
        }
        spec = cls(
            volume=None if volume is None else str(volume),
            volume_template=template,
            engine=data.get("engine"),
            workload=Workload.from_dict(data.get("workload") or {}),
            sweep=sweep,
            label=str(data.get("label") or ""),
        )
        points = spec.points()
        if len(points) > MAX_CELLS:
            raise InvalidInput(f"the sweep has {len(points)} cells; at most {MAX_CELLS}")
        for point in points:
            point.workload.validate()
            if template is not None and point.workload.span > template.device_size:
                raise InvalidInput(
                    f"the workload touches {point.workload.span} bytes; device_size is "
                    f"{template.device_size}"
                )
        return spec

    def to_dict(self) -> dict[str, Any]:
        """The spec as persisted and shown: keys in tables are zeroed (re-run with any key)."""
        template = None
        if self.volume_template is not None:
            template = {
                "table": redact(self.volume_template.table),
                "device_size": self.volume_template.device_size,
                "device_model": self.volume_template.device_model,
            }
        sweep = {
            axis: [redact(v) for v in values] if axis == "table" else list(values)
            for axis, values in self.sweep.items()
        }
        return {
            "volume": self.volume,
            "volume_template": template,
            "engine": self.engine,
            "workload": self.workload.to_dict(),
            "sweep": sweep,
            "label": self.label,
        }

    def points(self) -> list[CellPlan]:
        """The sweep's cartesian product, in ``SWEEP_AXES`` order (engine outermost)."""
        axes = [axis for axis in SWEEP_AXES if axis in self.sweep]
        plans = []
        for index, values in enumerate(itertools.product(*(self.sweep[a] for a in axes))):
            point = dict(zip(axes, values, strict=True))
            workload = replace(
                self.workload,
                **{k: point[k] for k in ("rw", "bs", "iodepth", "numjobs") if k in point},
            )
            table = point.get("table")
            if table is None and self.volume_template is not None:
                table = self.volume_template.table
            plans.append(
                CellPlan(
                    index=index,
                    engine=point.get("engine", self.engine),
                    dispatch_mode=point.get("dispatch_mode"),
                    table=table,
                    workload=workload,
                )
            )
        return plans


@dataclass(frozen=True, slots=True)
class CellPlan:
    index: int
    engine: str | None
    dispatch_mode: str | None
    table: str | None
    workload: Workload


# ---------------------------------------------------------------------- model


@dataclass(frozen=True, slots=True)
class ModelledTime:
    storage_ns: float
    crypto_ns: float
    total_ns: float


def modelled_time(
    *,
    storage_ns: float,
    ios: int,
    engine_busy_ns: float,
    engine_cpu_ns: float,
    channels: int,
    queue_depth: int,
) -> ModelledTime:
    """End-to-end modelled time of a cell from what it really did.

    ``storage_ns`` is what the data path's ``DeviceTimer`` charged over the
    cell (one device I/O per dispatched request, plus flushes) and ``ios`` the
    number of pipeline items (dispatched requests). Stages combine as
    ``predict_workload`` does: in series at queue depth 1; otherwise the
    bottleneck stage plus one item's share to fill the pipe.
    """
    crypto = engine_busy_ns + engine_cpu_ns
    if ios == 0:
        return ModelledTime(storage_ns, crypto, 0.0)
    if queue_depth <= 1:
        total = storage_ns + crypto
    else:
        first = (storage_ns + crypto) / ios
        bottleneck = max(storage_ns, engine_cpu_ns, engine_busy_ns / channels)
        total = first + bottleneck * (ios - 1) / ios
    return ModelledTime(storage_ns, crypto, total)


# ---------------------------------------------------------------------- machine


def machine_info() -> dict[str, Any]:
    """What a reader needs to judge or re-run a measurement."""
    import cryptography
    import numpy
    from cryptography.hazmat.backends.openssl.backend import backend

    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or _cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "numpy": numpy.__version__,
        "cryptography": cryptography.__version__,
        "openssl": backend.openssl_version_text(),
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


# ---------------------------------------------------------------------- cells

_COUNTERS = ("ios", "bios", "merges", "sectors")


def _counter_delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, int]:
    delta = {"engine_calls": after["engine_calls"] - before["engine_calls"]}
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


class CellRunner:
    """Runs one cell: builds (or retunes) its volume, runs the workload, measures and models."""

    def __init__(self, control: Control, engines: EngineRegistry) -> None:
        self.control = control
        self.engines = engines

    def run(
        self,
        spec: JobSpec,
        plan: CellPlan,
        name: str,
        progress: Callable[[int], None] | None = None,
    ) -> dict[str, Any]:
        template = spec.volume_template
        if template is not None:
            assert plan.table is not None
            self.control.create_device(name, template.device_size, _model_arg(template))
            try:
                volume = self.control.create_volume(
                    name,
                    plan.table.replace("{dev}", name),
                    engine=plan.engine or "software",
                    tuning=Tuning(dispatch_mode=plan.dispatch_mode or "request"),  # type: ignore[arg-type]
                )
            except BaseException:
                self.control.delete_device(name)
                raise
            try:
                return self._measure(volume, plan, template.device_model, progress)
            finally:
                self.control.remove(name, force=True)
                self.control.delete_device(name)
        assert spec.volume is not None
        volume = self.control.volume(spec.volume)
        original = (volume.dispatch_mode, volume.engine.name)
        self.control.retune(
            spec.volume,
            engine=plan.engine,
            patch=TuningPatch(dispatch_mode=plan.dispatch_mode),  # type: ignore[arg-type]
        )
        try:
            return self._measure(volume, plan, self._device_model_of(volume), progress)
        finally:
            self.control.retune(
                spec.volume, engine=original[1], patch=TuningPatch(dispatch_mode=original[0])
            )

    def _device_model_of(self, volume: Volume) -> str:
        params = _crypt_params(volume)
        if params is None or params.device.kind != "device":
            return "none"
        return self.control.device_models.get(params.device.name) or "none"

    def _measure(
        self,
        volume: Volume,
        plan: CellPlan,
        device_model: str,
        progress: Callable[[int], None] | None,
    ) -> dict[str, Any]:
        workload = plan.workload
        if workload.span > volume.size:
            raise InvalidInput(
                f"the workload touches {workload.span} bytes; volume {volume.name} has {volume.size}"
            )
        engine = volume.engine
        profile: EngineProfile = engine.profile
        timer = self.engines.device_timer(device_model)
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
        model = modelled_time(
            storage_ns=timer_after["busy_ns"] - timer_before["busy_ns"],
            ios=n_requests,
            engine_busy_ns=engine_after.clock.busy_ns - engine_before.clock.busy_ns,
            engine_cpu_ns=engine_after.cpu_ns - engine_before.cpu_ns,
            channels=profile.capabilities.channels,
            queue_depth=workload.concurrency,
        )
        params = _crypt_params(volume)
        spec_like: SpecLike | None = params.cipher if params is not None else None
        return {
            "n": plan.index,
            "volume": volume.name,
            "dispatch_mode": volume.dispatch_mode,
            "engine": profile.name,
            "engine_measured": profile.measured,
            "device_model": device_model,
            "cipher": str(spec_like) if params is not None else None,
            "sector_size": params.sector_size if params is not None else None,
            "bulk_applies": (
                profile.capabilities.derives_iv(spec_like) if spec_like is not None else None
            ),
            "fallback_reason": (
                profile.capabilities.fallback_reason(spec_like) if spec_like is not None else None
            ),
            "rw": workload.rw,
            "bs": workload.bs,
            "iodepth": workload.iodepth,
            "numjobs": workload.numjobs,
            "bytes": result.nbytes,
            "measured_mb_s": round(result.mb_s, 3),
            "modelled_mb_s": (
                round(result.nbytes / model.total_ns * 1e3, 3) if model.total_ns else None
            ),
            "iops": round(result.iops, 1),
            "p50_ms": round(result.percentile_ms(50), 4),
            "p99_ms": round(result.percentile_ms(99), 4),
            "cpu_s": None if result.cpu_s is None else round(result.cpu_s, 4),
            "elapsed_s": round(result.elapsed_s, 4),
            "bios": counters["r_bios"] + counters["w_bios"],
            "requests": n_requests,
            "merges": counters["r_merges"] + counters["w_merges"],
            "engine_calls": counters["engine_calls"],
            "bulk_calls": engine_after.bulk_calls - engine_before.bulk_calls,
            "unit_calls": engine_after.unit_calls - engine_before.unit_calls,
            "avg_request_kib": (
                round((counters["r_sectors"] + counters["w_sectors"]) / 2 / n_requests, 1)
                if n_requests
                else 0.0
            ),
            "request_size_histogram": _histogram_delta(stats_before, stats_after),
            "modelled_ms": round(model.total_ns / 1e6, 3),
            "device_ios": device_ios,
            "crypto_ms": round(model.crypto_ns / 1e6, 3),
            "storage_ms": round(model.storage_ns / 1e6, 3),
            "modelled_basis": (
                (
                    "software engine: measured call times"
                    if profile.measured
                    else "engine virtual clock (cost model over this cell's calls)"
                )
                + f"; storage: the data path's {device_model} device timer"
            ),
        }


def _model_arg(template: VolumeTemplate) -> str | None:
    return None if template.device_model == "none" else template.device_model


# ---------------------------------------------------------------------- jobs


@dataclass(slots=True)
class _Live:
    id: str
    spec: JobSpec
    state: str = "queued"
    progress: float = 0.0
    bytes_done: int = 0
    bytes_total: int = 0
    started: float | None = None
    cells: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


class BenchmarkJobs:
    """The service's job runner: one worker thread, jobs in submission order."""

    def __init__(
        self, sessions: sessionmaker[Session], control: Control, engines: EngineRegistry
    ) -> None:
        self.sessions = sessions
        self.cells = CellRunner(control, engines)
        self.control = control
        self.engines = engines
        self._live: dict[str, _Live] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._stopping = False
        self._machine: dict[str, Any] | None = None

    def machine(self) -> dict[str, Any]:
        if self._machine is None:
            self._machine = machine_info()
        return self._machine

    def recover(self) -> None:
        """Runs left queued or running by a previous process can never finish: mark them failed."""
        with self.sessions() as session, session.begin():
            for row in session.scalars(
                select(models.BenchmarkRun).where(
                    models.BenchmarkRun.state.in_(("queued", "running"))
                )
            ):
                row.state = "failed"
                row.error = "the service stopped before the run finished"
                row.finished_at = datetime.now(UTC)

    def check(self, spec: JobSpec) -> None:
        """Refuse at submission what would fail in the first cell (404 / 422, not a failed run)."""
        if spec.volume is not None:
            self.control.volume(spec.volume)
        for plan in spec.points():
            if plan.engine is not None:
                self.engines.profile(plan.engine)
            if plan.table is not None:
                parse_table(plan.table.replace("{dev}", "bench-check"))
        if spec.volume_template is not None:
            self.engines.device_model(spec.volume_template.device_model)

    def _insert_run(self, spec: JobSpec) -> str:
        """A queued ``BenchmarkRun`` row for ``spec``; returns its id."""
        with self.sessions() as session, session.begin():
            row = models.BenchmarkRun(
                state="queued",
                spec=spec.to_dict(),
                progress=0.0,
                results={},
                machine=self.machine(),
            )
            session.add(row)
            session.flush()
            return row.id

    def submit(self, spec: JobSpec) -> str:
        self.check(spec)
        run_id = self._insert_run(spec)
        with self._lock:
            self._live[run_id] = _Live(run_id, spec)
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._work, name="reqcrypt-bench", daemon=True
                )
                self._worker.start()
        self._queue.put(run_id)
        return run_id

    def run_now(
        self, spec: JobSpec, progress: Callable[[float], None] | None = None
    ) -> dict[str, Any]:
        """Run a job in the calling thread (the CLI), persisted like any other; returns it."""
        self.check(spec)
        run_id = self._insert_run(spec)
        live = _Live(run_id, spec)
        with self._lock:
            self._live[run_id] = live
        self._execute(live, progress)
        return self.get(run_id)

    def close(self, timeout: float = 30.0) -> None:
        """Stop after the current I/O; the running job is marked failed (``cancelled``)."""
        self._stopping = True
        self._queue.put(None)
        if self._worker is not None:
            self._worker.join(timeout)

    def _work(self) -> None:
        while True:
            run_id = self._queue.get()
            if run_id is None or self._stopping:
                return
            live = self._live[run_id]
            self._execute(live, None)

    def _execute(self, live: _Live, callback: Callable[[float], None] | None) -> None:
        spec = live.spec
        plans = spec.points()
        live.bytes_total = sum(plan.workload.total_bytes for plan in plans)
        live.started = time.monotonic()
        live.state = "running"
        self._persist(live)
        timed = spec.workload.runtime is not None

        def advance(nbytes: int) -> None:
            if self._stopping:
                raise ReqcryptError("cancelled: the service is stopping")
            live.bytes_done += nbytes
            if not timed and live.bytes_total:
                live.progress = min(0.999, live.bytes_done / live.bytes_total)
                if callback is not None:
                    callback(live.progress)

        try:
            for plan in plans:
                name = f"bench-{live.id}-{plan.index}"
                cell = self.cells.run(spec, plan, name, advance)
                live.cells.append(cell)
                if timed:
                    live.progress = len(live.cells) / len(plans)
                    if callback is not None:
                        callback(live.progress)
                self._persist(live)
            live.progress = 1.0
            live.state = "done"
        except Exception as exc:
            live.state = "failed"
            live.error = exc.detail if isinstance(exc, ReqcryptError) else repr(exc)
            log.warning("benchmark %s failed: %s", live.id, live.error, exc_info=True)
        self._persist(live, finished=True)
        with self._lock:
            self._live.pop(live.id, None)

    def _persist(self, live: _Live, *, finished: bool = False) -> None:
        with self.sessions() as session, session.begin():
            row = session.get(models.BenchmarkRun, live.id)
            if row is None:
                return
            row.state = live.state
            row.progress = live.progress
            row.error = live.error
            row.results = {
                "cells": list(live.cells),
                "bytes_done": live.bytes_done,
                "bytes_total": live.bytes_total,
                "figures": FIGURE_KINDS,
            }
            if finished:
                row.finished_at = datetime.now(UTC)

    def get(self, run_id: str) -> dict[str, Any]:
        with self.sessions() as session:
            row = session.get(models.BenchmarkRun, run_id)
            if row is None:
                raise BenchmarkNotFound(f"benchmark {run_id} not found")
            out = _row_dict(row)
        with self._lock:
            live = self._live.get(run_id)
        if live is not None:
            elapsed = time.monotonic() - live.started if live.started is not None else 0.0
            out.update(
                state=live.state,
                progress=round(live.progress, 4),
                bytes_done=live.bytes_done,
                bytes_total=live.bytes_total,
                elapsed_s=round(elapsed, 3),
                eta_s=(
                    round(elapsed / live.progress * (1 - live.progress), 1)
                    if live.progress > 0
                    else None
                ),
                cells=list(live.cells),
            )
        return out

    def list(self) -> list[dict[str, Any]]:
        with self.sessions() as session:
            rows = session.scalars(
                select(models.BenchmarkRun).order_by(models.BenchmarkRun.created_at.desc())
            ).all()
            summaries = []
            for row in rows:
                full = _row_dict(row)
                summaries.append({k: v for k, v in full.items() if k not in ("cells", "machine")})
        return summaries


def _row_dict(row: models.BenchmarkRun) -> dict[str, Any]:
    results = row.results or {}
    return {
        "id": row.id,
        "state": row.state,
        "progress": row.progress,
        "bytes_done": results.get("bytes_done", 0),
        "bytes_total": results.get("bytes_total", 0),
        "eta_s": 0.0 if row.state == "done" else None,
        "elapsed_s": (
            (row.finished_at - row.created_at).total_seconds()
            if row.finished_at is not None and row.created_at is not None
            else None
        ),
        "error": row.error,
        "created_at": row.created_at.isoformat() if row.created_at else None,
        "finished_at": row.finished_at.isoformat() if row.finished_at else None,
        "spec": row.spec,
        "machine": row.machine,
        "figures": results.get("figures", FIGURE_KINDS),
        "cells": results.get("cells", []),
    }
