"""Benchmarks: start a sweep (202 + id), watch it, export its cells as JSON, CSV and a plot."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from app.api.deps import AdminDep, RoleDep, StateDep
from app.api.problems import responses
from app.bench import report
from app.bench.jobs import BenchmarkJobs
from app.bench.spec import DEFAULT_ROUNDS, MAX_ROUNDS, MAX_WARMUP, JobSpec
from app.integers import JsonInt
from app.vocab import DispatchMode

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


class BenchmarkCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    volume: str | None = None
    volume_template: VolumeTemplateIn | None = None
    engine: str | None = None
    workload: WorkloadIn = Field(default_factory=WorkloadIn)
    sweep: SweepIn = Field(default_factory=SweepIn)
    label: str = ""
    rounds: JsonInt = Field(
        default=DEFAULT_ROUNDS,
        ge=1,
        le=MAX_ROUNDS,
        description="rounds kept per cell: its figure is their median with a 95 % interval",
    )
    warmup: JsonInt = Field(
        default=1, ge=0, le=MAX_WARMUP, description="rounds run first and discarded"
    )


class BenchmarkStarted(BaseModel):
    id: str
    state: str


@router.post(
    "", status_code=202, response_model=BenchmarkStarted, responses=responses(404, 409, 422, 503)
)
def start_benchmark(
    body: BenchmarkCreate, jobs: JobsDep, _: AdminDep, response: Response
) -> BenchmarkStarted:
    """Start a job on the background runner; poll ``GET /v1/benchmarks/{id}``.

    Template cells create ``bench-<id>-<n>`` devices and volumes and remove
    them afterwards; a named volume is retuned per cell and restored.
    """
    spec = JobSpec.from_dict(body.model_dump(exclude_none=True))
    run_id = jobs.submit(spec)
    response.headers["Location"] = f"/v1/benchmarks/{run_id}"
    return BenchmarkStarted(id=run_id, state="queued")


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
