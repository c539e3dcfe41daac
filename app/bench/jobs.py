"""Benchmark jobs: run a spec's cells on one worker thread, persist ``BenchmarkRun`` rows.

A job runs on one background worker thread, one round of one cell at a time, so
cells never compete with each other for the CPU or for an engine's virtual clock.
Rounds are interleaved: every cell's volume is prepared first, then round r of
every cell runs before round r+1 of any. A machine whose load drifts during a job
(another process, thermal throttling) then shifts both sides of a comparison
alike instead of whichever cells happened to run last; the cells' figures
appear when the last round is done.
Progress lives in memory (fine-grained, for GET) and is written to SQL after
every cell and at the end, so a finished run survives a restart and an
unfinished one is marked failed on the next start. What a cell measures and
models is ``app.bench.cells``'s; what a job asks for is ``app.bench.spec``'s.
"""

from __future__ import annotations

import logging
import os
import platform
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.bench.cells import FIGURE_KINDS, CellResult, CellRunner
from app.bench.spec import JobSpec
from app.config import BenchmarkSettings
from app.db import models
from app.dm.table import parse_table
from app.errors import BenchmarkNotFound, InvalidInput, ReqcryptError, Unavailable

__all__ = ["BenchmarkJobs", "machine_info"]

log = logging.getLogger("reqcrypt.bench")


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


@dataclass(slots=True)
class _Live:
    id: str
    spec: JobSpec
    state: str = "queued"
    progress: float = 0.0
    bytes_done: int = 0
    bytes_total: int = 0
    started: float | None = None
    cells: list[CellResult] = field(default_factory=list)
    error: str | None = None


class BenchmarkJobs:
    """The service's job runner: one worker thread, jobs in submission order."""

    def __init__(
        self, sessions: sessionmaker[Session], cells: CellRunner, limits: BenchmarkSettings
    ) -> None:
        self.sessions = sessions
        self.cells = cells
        self.limits = limits
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
            self.cells.control.volume(spec.volume)
        total = spec.runs_per_cell * sum(plan.workload.total_bytes for plan in spec.points())
        if total > self.limits.max_benchmark_bytes:
            raise InvalidInput(
                f"the job would move {total} bytes; at most {self.limits.max_benchmark_bytes} "
                "(REQCRYPT_MAX_BENCHMARK_BYTES)"
            )
        for plan in spec.points():
            if plan.table is not None:
                table = parse_table(plan.table.replace("{dev}", "bench-check"))
                engine = plan.engine or "software"
            else:
                assert spec.volume is not None
                volume = self.cells.control.volume(spec.volume)
                if volume.live is None:
                    continue
                table = volume.live.table
                engine = plan.engine or volume.engine.name
            capabilities = self.cells.engines.profile(engine).capabilities
            for params in table.crypt_params():
                reason = capabilities.unsupported_reason(params.cipher, params.sector_size)
                if reason is not None:
                    raise InvalidInput(f"engine {engine} cannot run cell {plan.index}: {reason}")
        if spec.volume_template is not None:
            self.cells.engines.device_model(spec.volume_template.device_model)

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
        return self.submit_all([spec])[0]

    def submit_all(self, specs: Sequence[JobSpec]) -> list[str]:
        """Queue ``specs`` in order, all or none: each is checked and the job limit is
        taken for all of them before the first is queued."""
        for spec in specs:
            self.check(spec)
        with self._lock:
            if len(self._live) + len(specs) > self.limits.max_benchmark_jobs:
                raise Unavailable(
                    f"{len(self._live)} benchmark jobs are queued or running and {len(specs)} "
                    f"more asked for; at most {self.limits.max_benchmark_jobs} "
                    "(REQCRYPT_MAX_BENCHMARK_JOBS): retry when one finishes",
                    retry_after=10,
                )
            run_ids = []
            for spec in specs:
                run_id = self._insert_run(spec)
                self._live[run_id] = _Live(run_id, spec)
                run_ids.append(run_id)
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._work, name="reqcrypt-bench", daemon=True
                )
                self._worker.start()
        for run_id in run_ids:
            self._queue.put(run_id)
        return run_ids

    def record(self, spec: dict[str, Any], results: dict[str, Any]) -> str:
        """Persist a run computed without the worker (a trace replay: modelled, no I/O)."""
        with self.sessions() as session, session.begin():
            row = models.BenchmarkRun(
                state="done",
                spec=spec,
                progress=1.0,
                results={"figures": FIGURE_KINDS, **results},
                machine=self.machine(),
                finished_at=datetime.now(UTC),
            )
            session.add(row)
            session.flush()
            return row.id

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
        live.bytes_total = spec.runs_per_cell * sum(plan.workload.total_bytes for plan in plans)
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
            with ExitStack() as stack:
                cells = [
                    stack.enter_context(self.cells.prepared(spec, plan, f"bench-{live.id}-{n}"))
                    for n, plan in enumerate(plans)
                ]
                for _ in range(spec.warmup):
                    for run_round in cells:
                        run_round(advance)
                kept: list[list[CellResult]] = [[] for _ in cells]
                for done in range(1, spec.rounds + 1):
                    for rounds, run_round in zip(kept, cells, strict=True):
                        rounds.append(run_round(advance))
                    if timed:
                        live.progress = done / spec.rounds
                        if callback is not None:
                            callback(live.progress)
                    self._persist(live)
            live.cells = [self.cells.summarise(spec, rounds) for rounds in kept]
            live.progress = 1.0
            final = "done"
        except Exception as exc:
            final = "failed"
            live.error = exc.detail if isinstance(exc, ReqcryptError) else repr(exc)
            log.warning("benchmark %s failed: %s", live.id, live.error, exc_info=True)
        # A job reads as finished only once its slot is free: a client that saw "done" may submit.
        with self._lock:
            live.state = final
            self._persist(live, finished=True)
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
                "cells": [cell.to_dict() for cell in live.cells],
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
                cells=[cell.to_dict() for cell in live.cells],
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
        **{key: results[key] for key in ("replay", "scenario") if key in results},
    }
