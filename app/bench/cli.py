"""``reqcrypt bench``: run benchmark jobs and built-in scenarios in-process, or a workload over HTTP.

In-process runs build their own application state (``build_state``) against a
temporary data directory and database by default, so they never touch a running
service's volumes or records; ``--data-dir`` points at a stopped service's directory
(and its database) to benchmark its volumes by name.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from app.bench.spec import ROUNDS, WARMUP, Count
from app.bench.workload import Workload
from app.commands.client import DEFAULT_URL, TokenOption, UrlOption, resolve_token
from app.errors import ReqcryptError
from app.sizes import format_size, parse_size

#: A round this long is well clear of timer and scheduling noise on a laptop.
DEFAULT_ROUND_SECONDS = 0.25

DataDirOption = Annotated[
    Path | None,
    typer.Option(
        metavar="DIR",
        help="a stopped service's state directory, opened with its database "
        "(default: a temporary directory and database)",
    ),
]
NumjobsOption = Annotated[int, typer.Option(metavar="N", help="jobs, each over its own region")]
SeedOption = Annotated[int, typer.Option(metavar="N", help="seed of the random offsets")]


def _count_option(count: Count, help: str) -> Any:
    """The option of a job's count, bounded as the spec bounds it."""
    return typer.Option(min=count.minimum, max=count.maximum, metavar="N", help=help)


bench_app = typer.Typer(help="Benchmarks: fio-like workloads, sweeps and built-in scenarios.")


@contextmanager
def _state(command: str, data_dir: Path | None) -> Iterator[Any]:
    """Application state for an in-process run.

    Without ``data_dir``: a temporary directory with its own SQLite database and master
    key, whatever the environment says of a service's (``REQCRYPT_DATABASE_URL``, its key,
    its node), so a run beside a service never touches the service's state. With it: that
    stopped service's directory, database and key, as ``serve`` would open them.
    """
    from prometheus_client import CollectorRegistry

    from app.main import build_state
    from app.startup import load_settings, refusals

    with tempfile.TemporaryDirectory(prefix="reqcrypt-bench-") as scratch:
        if data_dir is None:
            settings = load_settings(
                data_dir=Path(scratch),
                auth="disabled",
                database_url=None,
                master_key=None,
                master_key_file=None,
                node_id=None,
                node_url=None,
            )
        else:
            settings = load_settings(data_dir=data_dir, auth="disabled")
        with refusals(f"bench {command}"):
            state = build_state(settings, CollectorRegistry())
        try:
            yield state
        finally:
            state.benchmarks.close()
            state.control.close()
            state.db_engine.dispose()


def _csv(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


class _Bar:
    """A progress bar over 0..1 fractions (typer's bar counts integers)."""

    def __init__(self, label: str) -> None:
        self._context = typer.progressbar(length=1000, label=label, file=None)
        self._bar = self._context.__enter__()
        self._shown = 0

    def update(self, fraction: float) -> None:
        target = int(fraction * 1000)
        if target > self._shown:
            self._bar.update(target - self._shown)
            self._shown = target

    def close(self) -> None:
        self.update(1.0)
        self._context.__exit__(None, None, None)


def _fail(command: str, exc: ReqcryptError) -> typer.Exit:
    typer.echo(f"reqcrypt: bench {command}: {exc.detail}", err=True)
    return typer.Exit(2)


@bench_app.command("run")
def run(
    volume_template: Annotated[
        str | None,
        typer.Option(
            metavar="TABLE",
            help="table of a temporary volume per cell; the word {dev} stands for its device",
        ),
    ] = None,
    device_size: Annotated[
        str, typer.Option(metavar="SIZE", help="size of the template's device, e.g. 64M, 1.5G")
    ] = "64M",
    device_model: Annotated[
        str, typer.Option(metavar="MODEL", help="timing model of the template's device")
    ] = "none",
    volume: Annotated[
        str | None,
        typer.Option(metavar="NAME", help="an existing volume instead (needs --data-dir)"),
    ] = None,
    engine: Annotated[
        str | None, typer.Option(metavar="ENGINE", help="crypto engine (default: software)")
    ] = None,
    rw: Annotated[
        str, typer.Option(metavar="RW[,RW...]", help="fio rw mode; a comma list sweeps")
    ] = "read",
    bs: Annotated[
        str, typer.Option(metavar="SIZE[,SIZE...]", help="block size, e.g. 4k or 4k,64k,1M")
    ] = "4k",
    size: Annotated[
        str | None,
        typer.Option(
            metavar="SIZE",
            help="bytes per job and round, e.g. 16M (default: loop over 16M for "
            f"{DEFAULT_ROUND_SECONDS} s per round)",
        ),
    ] = None,
    iodepth: Annotated[
        str, typer.Option(metavar="N[,N...]", help="I/Os in flight per job; a comma list sweeps")
    ] = "1",
    numjobs: NumjobsOption = 1,
    direct: Annotated[
        bool, typer.Option(help="direct I/O; --no-direct flushes once at the end instead")
    ] = True,
    runtime: Annotated[
        float | None,
        typer.Option(metavar="SECONDS", help="run each round for this long instead of --size"),
    ] = None,
    rwmixread: Annotated[
        int, typer.Option(metavar="PERCENT", help="read share of randrw and readwrite")
    ] = 50,
    seed: SeedOption = 0,
    sweep_mode: Annotated[
        str, typer.Option(metavar="MODE[,MODE...]", help="dispatch modes compared")
    ] = "bio,request",
    sweep_engine: Annotated[
        str | None, typer.Option(metavar="ENGINE[,ENGINE...]", help="engines compared")
    ] = None,
    rounds: Annotated[
        int,
        _count_option(
            ROUNDS, "rounds kept per cell; its figure is their median with a 95 % interval"
        ),
    ] = ROUNDS.default,
    warmup: Annotated[int, _count_option(WARMUP, "rounds run first and discarded")] = (
        WARMUP.default
    ),
    as_json: Annotated[bool, typer.Option("--json", help="print the run as JSON")] = False,
    plot: Annotated[
        Path | None, typer.Option(metavar="FILE", help="write throughput against bs as PNG")
    ] = None,
    data_dir: DataDirOption = None,
) -> None:
    """Run one benchmark job in-process and print the bio vs request table.

    Each cell runs --warmup rounds, then --rounds rounds; the table shows their
    medians with 95 % intervals and the ratio of the two modes with its own.
    """
    from app.bench.spec import JobSpec

    if size is None and runtime is None:
        size, runtime = "16M", DEFAULT_ROUND_SECONDS

    job: dict[str, Any] = {
        "engine": engine,
        "rounds": rounds,
        "warmup": warmup,
        "workload": {
            "rw": _csv(rw)[0],
            "bs": _csv(bs)[0],
            "size": size or "16M",
            "iodepth": int(_csv(iodepth)[0]),
            "numjobs": numjobs,
            "direct": direct,
            "runtime": runtime,
            "rwmixread": rwmixread,
            "seed": seed,
        },
        "sweep": {
            "dispatch_mode": _csv(sweep_mode),
            "rw": _csv(rw),
            "bs": _csv(bs),
            "iodepth": [int(v) for v in _csv(iodepth)],
        },
    }
    if sweep_engine:
        job["sweep"]["engine"] = _csv(sweep_engine)
    if volume_template is not None:
        job["volume_template"] = {
            "table": volume_template,
            "device_size": device_size,
            "device_model": device_model,
        }
    if volume is not None:
        job["volume"] = volume
    try:
        spec = JobSpec.from_dict(job)
        with _state("run", data_dir) as state:
            bar = _Bar("bench") if not as_json else None
            try:
                result = state.benchmarks.run_now(spec, bar.update if bar else None)
            finally:
                if bar is not None:
                    bar.close()
    except ReqcryptError as exc:
        raise _fail("run", exc) from None
    _emit(result, as_json=as_json, plot=plot)


def _emit(result: dict[str, Any], *, as_json: bool, plot: Path | None) -> None:
    from app.bench import report  # numpy and matplotlib: only for commands that report

    cells = result["cells"]
    if plot is not None:
        failure = result["error"] or "failed" if result["state"] == "failed" else None
        title = result["spec"].get("label") or ""
        plot.write_bytes(report.plot_png(cells, title=title, failure=failure))
    if as_json:
        typer.echo(json.dumps(result, indent=2, default=str))
    else:
        if result["state"] != "done":
            typer.echo(f"run {result['id']} {result['state']}: {result['error']}", err=True)
        metric = report.default_metric(cells)
        kind = "measured" if metric.startswith("measured") else "modelled"
        typer.echo(report.render_table(report.compare(cells, metric=metric), unit=f"{kind} MB/s"))
        for cell in cells:
            for warning in cell.get("warnings") or ():
                typer.echo(
                    f"warning: cell {cell['n']} ({cell['dispatch_mode']}, {cell['engine']}, "
                    f"{cell['rw']} bs={format_size(cell['bs'])}): {warning}"
                )
        rounds_shown = cells[0].get("rounds", 1) if cells else 0
        typer.echo(
            f"run {result['id']} ({len(cells)} cells, median of {rounds_shown} rounds each); "
            "modelled = virtual clocks, measured = this host's wall clock"
        )
    if result["state"] != "done":
        raise typer.Exit(1)


@bench_app.command("scenario")
def run_scenario(
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="scenario name (see reqcrypt bench scenarios)")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="print runs as JSON")] = False,
    plot: Annotated[
        Path | None, typer.Option(metavar="FILE", help="write the scenario's plot as PNG")
    ] = None,
    data_dir: DataDirOption = None,
) -> None:
    """Run a built-in scenario; prints its Markdown tables."""
    from app.bench import scenarios

    try:
        scenarios.scenario(name)
        with _state("scenario", data_dir) as state:
            bars: dict[str, _Bar] = {}

            def progress(label: str, fraction: float) -> None:
                if as_json:
                    return
                if label not in bars:
                    for bar in bars.values():
                        bar.close()
                    bars.clear()
                    bars[label] = _Bar(label)
                bars[label].update(fraction)

            try:
                runs, rendered = scenarios.run_scenario(
                    name, state.benchmarks, state.engines, progress
                )
            finally:
                for bar in bars.values():
                    bar.close()
    except ReqcryptError as exc:
        raise _fail("scenario", exc) from None
    if plot is not None:
        plot.write_bytes(rendered.plot)
    if as_json:
        typer.echo(json.dumps(runs, indent=2, default=str))
    else:
        typer.echo(rendered.markdown)


@bench_app.command("replay")
def replay_command(
    trace_file: Annotated[
        Path, typer.Argument(help="blkparse text or fio iolog (v2, v3); - for stdin")
    ],
    cipher: Annotated[str, typer.Option(help="dm-crypt cipher")] = "aes-xts-plain64",
    sector_size: Annotated[int, typer.Option(help="data unit bytes")] = 512,
    device_model: Annotated[str, typer.Option(help="device model preset")] = "none",
    engine: Annotated[str, typer.Option(help="engine preset")] = "software",
    elevator: Annotated[str, typer.Option(help="none or mq-deadline")] = "none",
    queue_depth: Annotated[
        int | None, typer.Option(help="device tags (default: the model's)")
    ] = None,
    plug_window_us: Annotated[int, typer.Option(help="plug window")] = 50,
    loop: Annotated[
        str, typer.Option(help="open: at the trace's times; closed: --iodepth in flight")
    ] = "open",
    iodepth: Annotated[int, typer.Option(help="bios in flight in closed loop")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
    csv: Annotated[Path | None, typer.Option(help="write the cells as CSV")] = None,
    plot: Annotated[Path | None, typer.Option(help="write the throughput plot as PNG")] = None,
) -> None:
    """Replay a block trace against a modelled volume, bio vs request mode (modelled time)."""
    import sys

    from app.bench import replay, report
    from app.engine.presets import DEVICE_MODELS, ENGINES
    from app.startup import refusals

    if engine not in ENGINES or device_model not in DEVICE_MODELS:
        typer.echo(
            f"reqcrypt bench: engines: {', '.join(ENGINES)}; device models: "
            f"{', '.join(DEVICE_MODELS)}",
            err=True,
        )
        raise typer.Exit(2)
    with refusals("bench replay"):
        text = (
            sys.stdin.read() if str(trace_file) == "-" else trace_file.read_text(errors="replace")
        )
    config = replay.ReplayConfig(
        cipher=cipher,
        sector_size=sector_size,
        elevator="mq-deadline" if elevator == "mq-deadline" else "none",
        queue_depth=queue_depth,
        plug_window_us=plug_window_us,
        loop="closed" if loop == "closed" else "open",
        iodepth=iodepth,
    )
    try:
        if elevator not in ("none", "mq-deadline") or loop not in ("open", "closed"):
            raise ReqcryptError("--elevator is none or mq-deadline, --loop open or closed")
        result = replay.replay(
            replay.parse_trace(text), ENGINES[engine], DEVICE_MODELS[device_model], config
        )
    except ReqcryptError as exc:
        raise _fail("replay", exc) from None
    if csv is not None:
        csv.write_text(report.cells_csv(result["cells"]))
    if plot is not None:
        plot.write_bytes(report.plot_png(result["cells"], title=f"replay of {trace_file.name}"))
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        typer.echo(replay.render_report(result), nl=False)


@bench_app.command("scenarios")
def list_scenarios() -> None:
    """List the built-in scenarios."""
    from app.bench.scenarios import SCENARIOS

    for scenario in SCENARIOS.values():
        typer.echo(f"{scenario.name:14} {scenario.summary}")


@bench_app.command("http")
def http(
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    volume: Annotated[str, typer.Option(metavar="NAME", help="volume name")] = "vol",
    rw: Annotated[str, typer.Option(metavar="RW", help="fio rw mode")] = "read",
    bs: Annotated[str, typer.Option(metavar="SIZE", help="block size, e.g. 64k")] = "64k",
    size: Annotated[str, typer.Option(metavar="SIZE", help="bytes per job, e.g. 16M")] = "16M",
    iodepth: Annotated[int, typer.Option(metavar="N", help="requests in flight per job")] = 4,
    numjobs: NumjobsOption = 1,
    runtime: Annotated[
        float | None, typer.Option(metavar="SECONDS", help="run this long instead of --size")
    ] = None,
    seed: SeedOption = 0,
    batch: Annotated[
        bool,
        typer.Option(
            help="hand each job's iodepth I/Os to the service as one batched request "
            "(fio's iodepth_batch); --no-batch: one request per I/O from iodepth threads"
        ),
    ] = True,
) -> None:
    """Run a workload over HTTP against a running service (client-side figures, measured).

    httpx saturates near 1.6k requests/s (docs/benchmarks.md): for small blocks and
    --no-batch this measures the client as much as the service.
    """
    from app.bench.runner import HttpTarget, run_workload

    try:
        workload = Workload(
            rw=rw,  # type: ignore[arg-type]
            bs=parse_size(bs),
            size=parse_size(size),
            iodepth=iodepth,
            numjobs=numjobs,
            runtime=runtime,
            seed=seed,
        ).validate()
        target = HttpTarget(
            url, volume, token=resolve_token(token), concurrency=workload.concurrency
        )
        try:
            result = run_workload(target, workload, measure_cpu=False, batch=batch and iodepth > 1)
        finally:
            target.close()
    except ReqcryptError as exc:
        raise _fail("http", exc) from None
    typer.echo(
        f"{rw} bs={format_size(workload.bs)} iodepth={iodepth} numjobs={numjobs}: "
        f"{result.nbytes} bytes in {result.ios} I/Os, {result.elapsed_s:.2f} s, "
        f"{result.mb_s:.1f} MB/s, {result.iops:.0f} IOPS, p50 {result.percentile_ms(50):.2f} ms, "
        f"p99 {result.percentile_ms(99):.2f} ms (measured, client side over HTTP)"
    )


@bench_app.command("soak")
def soak_command(
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    clients: Annotated[
        int, typer.Option(min=1, max=1024, metavar="N", help="concurrent clients")
    ] = 64,
    duration: Annotated[
        float, typer.Option(min=1, max=3600, metavar="SECONDS", help="seconds of load")
    ] = 60.0,
    volumes: Annotated[int, typer.Option(min=1, max=16, metavar="N", help="volumes to create")] = 3,
    size: Annotated[str, typer.Option(metavar="SIZE", help="bytes per volume, e.g. 16M")] = "16M",
    seed: Annotated[int, typer.Option(metavar="N", help="random seed")] = 0,
    max_rss_growth: Annotated[
        float,
        typer.Option(metavar="FRACTION", help="largest server RSS growth after warm-up, e.g. 0.10"),
    ] = 0.10,
) -> None:
    """A bounded soak of a running service on this machine (loopback only).

    Mixed single, partial and batched writes, checked reads, multi-range reads,
    flushes, and suspend/resume of the volumes under load; then every block is
    read back and compared. Exit 1 on any lost or changed write, any error status
    but a 503 while suspended, or server RSS growing more than --max-rss-growth.
    """
    import asyncio

    from app.bench.soak import soak

    try:
        result = asyncio.run(
            soak(
                url,
                resolve_token(token),
                clients=clients,
                duration_s=duration,
                volumes=volumes,
                size=parse_size(size),
                seed=seed,
            )
        )
    except ReqcryptError as exc:
        raise _fail("soak", exc) from None
    for line in result.lines():
        typer.echo(line)
    growth = result.rss_growth
    if result.failures or (growth is not None and growth > max_rss_growth):
        raise typer.Exit(1)
