"""Benchmarks: start a sweep (202 + id), watch it, export its cells as JSON, CSV and a plot."""

from __future__ import annotations

from dataclasses import fields
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from app.api.deps import AdminDep, RoleDep, StateDep
from app.api.problems import responses
from app.bench import replay, report, scenarios
from app.bench.jobs import BenchmarkJobs
from app.bench.spec import ROUNDS, WARMUP, JobSpec
from app.integers import JsonInt, integral_float
from app.vocab import DATA_UNIT_SIZES, MAX_QUEUE_DEPTH, DispatchMode, ElevatorName

router = APIRouter(prefix="/v1/benchmarks", tags=["benchmarks"], responses=responses(401, 403))

Size = JsonInt | str
RwField = Literal["read", "write", "randread", "randwrite", "randrw", "readwrite"]


def get_jobs(state: StateDep) -> BenchmarkJobs:
    return state.benchmarks


JobsDep = Annotated[BenchmarkJobs, Depends(get_jobs)]


class VolumeTemplateIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    table: str = Field(
        description="dmsetup table with {dev} where the temporary device goes",
        pattern=r"\{dev\}",
        examples=[
            "0 131072 crypt aes-xts-plain64 "
            "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f 0 {dev} 0"
        ],
    )
    device_size: Size = Field(default=64 << 20, description="bytes, or 64M / 1G")
    device_model: str = Field(default="none", examples=["sdcard-bbb"])


class WorkloadIn(BaseModel):
    """fio's names; sizes accept 4k / 1M / bytes. ``size`` is per job."""

    model_config = ConfigDict(extra="forbid", strict=True)

    rw: RwField = "read"
    bs: Size = 4096
    size: Size = 1 << 20
    offset: Size = 0
    iodepth: JsonInt = Field(default=1, ge=1, le=256)
    numjobs: JsonInt = Field(default=1, ge=1, le=64)
    direct: bool = True
    runtime: float | None = Field(default=None, gt=0, le=3600)
    rwmixread: JsonInt = Field(default=50, ge=0, le=100)
    seed: JsonInt = 0


class SweepIn(BaseModel):
    """Axes of the sweep; cells are their cartesian product."""

    model_config = ConfigDict(extra="forbid", strict=True)

    dispatch_mode: list[DispatchMode] | None = Field(default=None, min_length=1)
    bs: list[Size] | None = Field(default=None, min_length=1)
    engine: list[str] | None = Field(default=None, min_length=1)
    rw: list[RwField] | None = Field(default=None, min_length=1)
    iodepth: list[JsonInt] | None = Field(default=None, min_length=1)
    numjobs: list[JsonInt] | None = Field(default=None, min_length=1)
    table: list[str] | None = Field(
        default=None, min_length=1, description="table variants (templates only)"
    )


#: Characters of an uploaded trace: about 40 000 blkparse lines.
MAX_TRACE_CHARS = 4 << 20

_IOLOG_EXAMPLE = (
    "fio version 3 iolog\n0 /dev/sdb add\n0 /dev/sdb open\n"
    "0 /dev/sdb write 0 4096\n0 /dev/sdb write 4096 4096\n3 /dev/sdb read 1048576 65536\n"
    "5 /dev/sdb close\n"
)


class ReplayIn(BaseModel):
    """A trace to replay against a modelled volume instead of a workload (docs/benchmarks.md)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    trace: str = Field(
        min_length=1,
        max_length=MAX_TRACE_CHARS,
        description="blkparse text (its Q events are the bios) or a fio iolog, version 2 or 3",
        examples=[_IOLOG_EXAMPLE],
    )
    cipher: str = Field(
        default="aes-xts-plain64",
        max_length=128,
        pattern=r"^(capi:\w+\(\w+\)(-\w+(:\S+)?)?|\w+(:\d+)?-\w+(-\w+(:\S+)?)?)$",
        examples=["aes-cbc-plain64"],
    )
    sector_size: Annotated[
        int,
        Field(strict=True, json_schema_extra={"enum": sorted(DATA_UNIT_SIZES)}),
        BeforeValidator(integral_float),
    ] = 512
    device_model: str = Field(default="none", max_length=64, examples=["sdcard-bbb"])
    engine: str = Field(default="software", max_length=64, examples=["omap-aes-am335x"])
    elevator: ElevatorName = "none"
    queue_depth: (
        Annotated[int, Field(ge=1, le=MAX_QUEUE_DEPTH), BeforeValidator(integral_float)] | None
    ) = Field(default=None, description="device tags; null: the model's")
    plug_window_us: JsonInt = Field(default=50, ge=0, le=1_000_000)
    loop: Literal["open", "closed"] = Field(
        default="open", description="open: at the trace's times; closed: iodepth bios in flight"
    )
    iodepth: JsonInt = Field(default=1, ge=1, le=4096)


class BenchmarkCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    volume: str | None = None
    volume_template: VolumeTemplateIn | None = None
    engine: str | None = None
    workload: WorkloadIn = Field(default_factory=WorkloadIn)
    sweep: SweepIn = Field(default_factory=SweepIn)
    label: str = ""
    rounds: JsonInt = Field(
        default=ROUNDS.default,
        ge=ROUNDS.minimum,
        le=ROUNDS.maximum,
        description="rounds kept per cell: its figure is their median with a 95 % interval",
    )
    warmup: JsonInt = Field(
        default=WARMUP.default,
        ge=WARMUP.minimum,
        le=WARMUP.maximum,
        description="rounds run first and discarded",
    )


_REPLAY_CONFIG_FIELDS = {field.name for field in fields(replay.ReplayConfig)}
"""What of a ``ReplayIn`` configures the modelled volume (the rest picks the trace and models)."""


class ReplayCreate(BaseModel):
    """A trace replayed against a modelled volume: a body of its own, nothing else beside it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    replay: ReplayIn
    label: str = ""


class ScenarioCreate(BaseModel):
    """A built-in scenario (``reqcrypt bench scenarios``): modelled ones answer at once."""

    model_config = ConfigDict(extra="forbid", strict=True)

    scenario: str = Field(max_length=64, examples=["dm-crypt-flags"])
    label: str = ""


class BenchmarkStarted(BaseModel):
    id: str
    state: str
    runs: list[str] = Field(
        default_factory=list, description="a scenario's runs, one per job, the first is id"
    )


@router.post(
    "", status_code=202, response_model=BenchmarkStarted, responses=responses(404, 409, 422, 503)
)
def start_benchmark(
    body: BenchmarkCreate | ReplayCreate | ScenarioCreate,
    jobs: JobsDep,
    _: AdminDep,
    response: Response,
) -> BenchmarkStarted:
    """Start a job on the background runner; poll ``GET /v1/benchmarks/{id}``.

    Template cells create ``bench-<id>-<n>`` devices and volumes and remove
    them afterwards; a named volume is retuned per cell and restored. A body
    with ``replay`` (a blkparse text or fio iolog, nothing else beside it) is
    modelled at once: the answer names a run already done. A body with ``scenario``
    runs a built-in scenario: a modelled one (``dm-crypt-flags``) is recorded done with
    its tables; one made of jobs queues them, one run each, listed in ``runs``.
    """
    if isinstance(body, ReplayCreate):
        run_id = _replay(body, jobs)
        response.headers["Location"] = f"/v1/benchmarks/{run_id}"
        return BenchmarkStarted(id=run_id, state="done")
    if isinstance(body, ScenarioCreate):
        started = _scenario(body, jobs)
        response.headers["Location"] = f"/v1/benchmarks/{started.id}"
        return started
    spec = JobSpec.from_dict(body.model_dump(exclude_none=True))
    run_id = jobs.submit(spec)
    response.headers["Location"] = f"/v1/benchmarks/{run_id}"
    return BenchmarkStarted(id=run_id, state="queued")


def _scenario(body: ScenarioCreate, jobs: BenchmarkJobs) -> BenchmarkStarted:
    chosen = scenarios.scenario(body.scenario)
    specs = [JobSpec.from_dict(job) for job in chosen.jobs()]
    if not specs:
        rendered = chosen.render([])
        spec = {"label": body.label or chosen.summary, "scenario": chosen.name}
        results = {"cells": [], "scenario": {"markdown": rendered.markdown, **rendered.data}}
        run_id = jobs.record(spec, results)
        return BenchmarkStarted(id=run_id, state="done", runs=[run_id])
    scenarios.install_engines(jobs.cells.engines)
    runs = jobs.submit_all(specs)
    return BenchmarkStarted(id=runs[0], state="queued", runs=runs)


def _replay(body: ReplayCreate, jobs: BenchmarkJobs) -> str:
    """A replay is modelled, not run: computed here and recorded done."""
    given = body.replay
    config = replay.ReplayConfig(**given.model_dump(include=_REPLAY_CONFIG_FIELDS))
    result = replay.replay(
        replay.parse_trace(given.trace),
        jobs.cells.engines.profile(given.engine),
        jobs.cells.engines.device_model(given.device_model),
        config,
    )
    spec = {"label": body.label, "replay": given.model_dump(exclude={"trace"})}
    cells = result.pop("cells")
    return jobs.record(spec, {"cells": cells, "replay": result})


@router.get("")
def list_benchmarks(jobs: JobsDep, _: RoleDep) -> list[dict[str, Any]]:
    return jobs.list()


@router.get("/{run_id}", responses=responses(404))
def get_benchmark(run_id: str, jobs: JobsDep, _: RoleDep) -> dict[str, Any]:
    """State, progress (0..1), bytes done, ETA and, as they finish, the cells."""
    return jobs.get(run_id)


@router.get(
    "/{run_id}/results.json",
    responses=responses(404),
)
def results_json(run_id: str, jobs: JobsDep, _: RoleDep) -> dict[str, Any]:
    """The whole run: spec, machine, figure kinds (measured/modelled) and cells."""
    return jobs.get(run_id)


@router.get(
    "/{run_id}/results.csv",
    response_class=Response,
    responses={200: {"content": {"text/csv": {}}}, **responses(404)},
)
def results_csv(run_id: str, jobs: JobsDep, _: RoleDep) -> Response:
    run = jobs.get(run_id)
    return Response(
        report.cells_csv(run["cells"]),
        media_type="text/csv",
        headers={"Content-Disposition": f'attachment; filename="benchmark-{run_id}.csv"'},
    )


@router.get(
    "/{run_id}/plot.png",
    response_class=Response,
    responses={200: {"content": {"image/png": {}}}, **responses(404)},
)
def plot(
    run_id: str,
    jobs: JobsDep,
    _: RoleDep,
    metric: Annotated[
        Literal["measured_mb_s", "modelled_mb_s"] | None,
        Query(description="default: measured for the software engine, modelled otherwise"),
    ] = None,
) -> Response:
    """Throughput vs block size, one line per mode/engine, with 95 % error bars.

    The title names cipher, engine, block size and depth; a failed run says so across it.
    """
    run = jobs.get(run_id)
    failure = run["error"] or "failed" if run["state"] == "failed" else None
    png = report.plot_png(
        run["cells"], metric=metric, title=run["spec"].get("label") or "", failure=failure
    )
    return Response(png, media_type="image/png")
