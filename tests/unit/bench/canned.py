"""Canned benchmark runs: one cell per sweep point of a scenario's jobs, figures chosen here."""

from __future__ import annotations

from typing import Any

from app.bench import scenarios
from app.bench.cells import CellResult
from app.bench.spec import CellPlan, JobSpec
from app.dm.table import CryptParams, parse_table
from app.engine.presets import ENGINES

PROFILES = {**ENGINES, **{profile.name: profile for profile in scenarios.custom_engines()}}


def modelled_mb_s(plan: CellPlan, sector_size: int) -> float:
    """Request mode doubles, reads are 1.5x writes, throughput scales with the data unit."""
    mode = 2.0 if plan.dispatch_mode == "request" else 1.0
    rw = 3.0 if "read" in plan.workload.rw else 2.0
    return mode * rw * sector_size / 512


def canned_cell(spec: JobSpec, plan: CellPlan) -> dict[str, Any]:
    assert spec.volume_template is not None
    assert plan.table is not None
    assert plan.engine is not None
    (line,) = parse_table(plan.table.replace("{dev}", "sda")).lines
    assert isinstance(line.target, CryptParams)
    params = line.target
    capabilities = PROFILES[plan.engine].capabilities
    workload = plan.workload
    bios = workload.total_bytes // workload.bs
    merged = plan.dispatch_mode == "request" and workload.concurrency > 1
    requests = bios // 4 if merged else bios
    figure = modelled_mb_s(plan, params.sector_size)
    return CellResult(
        n=plan.index,
        volume=f"bench-canned-{plan.index}",
        dispatch_mode=plan.dispatch_mode or "request",
        engine=plan.engine,
        engine_measured=plan.engine == "software",
        device_model=spec.volume_template.device_model,
        cipher=str(params.cipher),
        sector_size=params.sector_size,
        bulk_applies=capabilities.derives_iv(params.cipher),
        fallback_reason=capabilities.fallback_reason(params.cipher),
        rw=workload.rw,
        bs=workload.bs,
        iodepth=workload.iodepth,
        numjobs=workload.numjobs,
        bytes=workload.total_bytes,
        measured_mb_s=figure * 10,
        modelled_mb_s=figure,
        iops=100.0,
        p50_ms=1.0,
        p99_ms=2.0,
        cpu_s=1.0 if plan.dispatch_mode == "bio" else 0.5,
        elapsed_s=1.0,
        bios=bios,
        requests=requests,
        merges=bios - requests,
        engine_calls=requests,
        bulk_calls=requests,
        unit_calls=0,
        avg_request_kib=workload.total_bytes / requests / 1024,
        request_size_histogram={f"{workload.total_bytes // requests // 1024}k": requests},
        modelled_ms=1.0,
        device_ios=requests,
        crypto_ms=0.5,
        storage_ms=0.5,
        modelled_basis="canned",
    ).to_dict()


def canned_runs(scenario: scenarios.Scenario) -> list[dict[str, Any]]:
    runs = []
    for job in scenario.jobs():
        spec = JobSpec.from_dict(job)
        cells = [canned_cell(spec, plan) for plan in spec.points()]
        runs.append({"state": "done", "spec": spec.to_dict(), "cells": cells})
    return runs
