"""Built-in scenarios: the kernel thread's experiments as one command each.

A scenario is a few ``JobSpec`` dicts (run like any API job, persisted), the
custom engine profiles it needs, and a renderer that turns the finished runs
into Markdown tables and one plot. Sizes are chosen so each scenario runs in
well under two minutes on a 2-core machine: modelled figures come from the
virtual clocks, which need I/O counts, not big transfers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from app.bench import report
from app.bench.cells import CellResult
from app.bench.jobs import BenchmarkJobs
from app.bench.spec import JobSpec
from app.engine import queuefit
from app.engine.model import EngineProfile
from app.engine.presets import OMAP_AES_AM335X
from app.engine.registry import EngineRegistry
from app.errors import AlreadyExists, InvalidInput
from app.sizes import format_size

Run = Mapping[str, Any]

STOCK_ENGINE = "omap-aes-am335x-stock"
PLAIN64_ENGINE = "omap-plain64-only"

#: The RFC's dd 512 KiB direct-I/O figures (MB/s): bio-based = stock dm-crypt.
PUBLISHED_DD = {
    ("read", "bio"): 5.8,
    ("read", "request"): 13.0,
    ("write", "bio"): 4.9,
    ("write", "request"): 9.2,
}
#: How much the RFC's dd write runs moved (128 x 512 KiB): a run this short stays in the SD
#: card's write buffer. Its read runs' length is not stated (reads fill no buffer).
PUBLISHED_DD_WRITE_RUN = 64 << 20
#: Marvell CESA, aes-cbc-essiv:sha256 writes through bio-based dm-crypt (MB/s).
PUBLISHED_SECTOR = {512: 12.9, 4096: 40.5}


def _published_dd(x: Any = None) -> list[report.Published]:
    """PUBLISHED_DD as plot markers: bio beside stock dm-crypt, request beside the bulk engine."""

    def stock(cell: report.Cell) -> bool:
        return bool(cell["engine"] == STOCK_ENGINE)

    def request_mode(cell: report.Cell) -> bool:
        return cell["engine"] != STOCK_ENGINE and str(cell["dispatch_mode"]).startswith("request")

    where = {"bio": stock, "request": request_mode}
    return [
        report.Published(
            rw, mb_s, where[mode], x, PUBLISHED_DD_WRITE_RUN if rw == "write" else None
        )
        for (rw, mode), mb_s in PUBLISHED_DD.items()
    ]


def custom_engines() -> list[EngineProfile]:
    """Profiles derived from the AM335x preset (same cost model, other capabilities)."""
    caps = OMAP_AES_AM335X.capabilities
    return [
        replace(
            OMAP_AES_AM335X,
            name=STOCK_ENGINE,
            description="AM335x AES as stock dm-crypt uses it: no bulk, one call per data unit.",
            capabilities=replace(caps, bulk_ivmodes=frozenset()),
        ),
        replace(
            OMAP_AES_AM335X,
            name=PLAIN64_ENGINE,
            description=(
                "AM335x cost model with xts added; derives only plain64 IVs in bulk and holds "
                "no IV key, so essiv falls back to one call per unit."
            ),
            capabilities=replace(
                caps,
                chainmodes=frozenset({"ecb", "cbc", "xts"}),
                bulk_ivmodes=frozenset({"plain64"}),
                keyed_iv=False,
            ),
        ),
    ]


def install_engines(engines: EngineRegistry) -> None:
    for profile in custom_engines():
        with contextlib.suppress(AlreadyExists):
            engines.add_profile(profile)


def _key(nbytes: int) -> str:
    return os.urandom(nbytes).hex()


def _table(cipher: str, key_bytes: int, sectors: int, extra: str = "") -> str:
    return f"0 {sectors} crypt {cipher} {_key(key_bytes)} 0 {{dev}} 0{extra}"


def _template(table: str, size: int, model: str) -> dict[str, Any]:
    return {"table": table, "device_size": size, "device_model": model}


def _job(
    label: str,
    template: dict[str, Any],
    engine: str,
    workload: dict[str, Any],
    **sweep: Sequence[Any],
) -> dict[str, Any]:
    """One job of a scenario as ``JobSpec.from_dict`` reads it; ``sweep`` maps axes to values."""
    return {
        "label": label,
        "volume_template": template,
        "engine": engine,
        "workload": workload,
        "sweep": sweep,
    }


@dataclass(frozen=True, slots=True)
class ScenarioReport:
    markdown: str
    plot: bytes
    cells: list[CellResult] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    """What a modelled scenario computed, as JSON for the API's run record."""


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    summary: str
    jobs: Callable[[], list[dict[str, Any]]]
    render: Callable[[Sequence[Run]], ScenarioReport]


def _cells(runs: Sequence[Run]) -> list[CellResult]:
    return [CellResult.from_dict(cell) for run in runs for cell in run["cells"]]


def _relabel(
    cells: Sequence[CellResult], label: Callable[[CellResult], str]
) -> list[dict[str, Any]]:
    """Copies of ``cells`` whose ``dispatch_mode`` is a display label (for plots and pairing)."""
    return [{**cell, "dispatch_mode": label(cell)} for cell in cells]


def _by_cipher_and_mode(cells: Sequence[CellResult]) -> list[dict[str, Any]]:
    """Copies labelled ``<iv mode> <dispatch mode>`` (cipher folded in, so plot legends stay short)."""
    return [
        {**cell, "dispatch_mode": f"{_short_cipher(cell)} {cell.dispatch_mode}", "cipher": None}
        for cell in cells
    ]


def _short_cipher(cell: CellResult) -> str:
    return str(cell.cipher).split("-")[-1]


def _kernel_label(cell: CellResult) -> str:
    if cell.engine == STOCK_ENGINE:
        return "bio (stock dm-crypt, per-unit)"
    return f"{cell.dispatch_mode} (bulk engine)"


# ---------------------------------------------------------------------- dd-512k

_SD = 64 << 20
_SD_SECTORS = _SD // 512


def _dd_jobs() -> list[dict[str, Any]]:
    template = _template(_table("aes-cbc-plain64", 16, _SD_SECTORS), _SD, "sdcard-bbb")
    # The publication's write run length (the card's buffer takes all of it), reads alike.
    workload = {"bs": "512k", "size": "64M", "iodepth": 1, "direct": True}
    rw = ["read", "write"]
    return [
        _job(
            "dd-512k: stock dm-crypt (bio-based)",
            template,
            STOCK_ENGINE,
            workload,
            rw=rw,
            dispatch_mode=["bio"],
        ),
        _job(
            "dd-512k: this service, bulk engine",
            template,
            "omap-aes-am335x",
            workload,
            rw=rw,
            dispatch_mode=["bio", "request"],
        ),
    ]


def _dd_render(runs: Sequence[Run]) -> ScenarioReport:
    cells = _cells(runs)
    kernel = [c for c in cells if c.engine == STOCK_ENGINE or c.dispatch_mode == "request"]
    rows = report.compare(kernel, ignore=("engine",))
    published = [
        (f"{PUBLISHED_DD[(row.test, 'bio')]:.1f}", f"{PUBLISHED_DD[(row.test, 'request')]:.1f}")
        for row in rows
    ]
    table = report.render_table(
        [replace(row, test=f"dd {row.test}") for row in rows],
        base="bio (stock)",
        other="request (bulk)",
        unit="modelled MB/s",
        extra=_published_columns(published, "bio", "request"),
    )
    service = [c for c in cells if c.engine == "omap-aes-am335x"]
    service_table = report.render_table(report.compare(service), unit="modelled MB/s")
    calls = _calls_table(cells, _kernel_label)
    published_dd = _published_dd()
    markdown = "\n\n".join(
        [
            "Kernel thread's comparison (stock bio-based dm-crypt vs request-based with the "
            "bulk engine), modelled, next to the published figures:",
            table,
            *_runs(cells, published_dd, _kernel_label),
            "This service's bio mode on the same bulk engine (one call per bio): at queue "
            "depth 1 a 512 KiB bio is already the whole request, so the modes tie:",
            service_table,
            calls,
        ]
    )
    plot = report.plot_png(
        _relabel(cells, _kernel_label),
        metric="modelled_mb_s",
        title="dd 512k direct, AM335x + SD",
        x_axis="rw",
        published=published_dd,
    )
    return ScenarioReport(markdown, plot, cells)


def _runs(
    cells: Sequence[CellResult],
    published: Sequence[report.Published],
    label: Callable[[CellResult], str],
) -> list[str]:
    """Each compared cell's run length and write regime beside its published figure, and a
    warning for a run whose length differs from the publication's."""

    def labelled(cell: report.Cell) -> str:
        return label(cast("CellResult", cell))

    parts = [
        "How long each compared cell ran, and where the device's write buffer had its writes:",
        report.render_runs(cells, published, labelled),
    ]
    parts += [f"Warning: {line}" for line in report.run_length_warnings(cells, published, labelled)]
    return parts


def _published_columns(
    published: Sequence[tuple[str, str]], base: str, other: str
) -> dict[str, list[str]]:
    """The published (base, other) figures of each row as two extra table columns."""
    return {
        f"published {base}": [p[0] for p in published],
        f"published {other}": [p[1] for p in published],
    }


def _calls_table(cells: Sequence[CellResult], label: Callable[[CellResult], str]) -> str:
    header = "| variant | rw | bs | bios | requests | engine calls | measured MB/s (host) | modelled MB/s |"
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for cell in cells:
        lines.append(
            f"| {label(cell)} | {cell.rw} | {format_size(cell.bs)} | {cell.bios} | "
            f"{cell.requests} | {cell.engine_calls} | {cell.measured_mb_s:.1f} | "
            f"{cell.modelled_mb_s:.2f} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------- bs-sweep


def _bs_jobs() -> list[dict[str, Any]]:
    template = _template(_table("aes-cbc-plain64", 16, _SD_SECTORS), _SD, "sdcard-bbb")
    workload = {"size": "64M", "iodepth": 1, "direct": True}
    sweep = {"rw": ["read", "write"], "bs": ["4k", "64k", "256k", "1M"]}
    return [
        _job(
            "bs-sweep: stock dm-crypt",
            template,
            STOCK_ENGINE,
            workload,
            **sweep,
            dispatch_mode=["bio"],
        ),
        _job(
            "bs-sweep: bulk engine",
            template,
            "omap-aes-am335x",
            workload,
            **sweep,
            dispatch_mode=["bio", "request"],
        ),
    ]


def _bs_render(runs: Sequence[Run]) -> ScenarioReport:
    cells = _cells(runs)
    kernel = [c for c in cells if c.engine == STOCK_ENGINE or c.dispatch_mode == "request"]
    table = report.render_table(
        report.compare(kernel, ignore=("engine",)),
        base="bio (stock)",
        other="request (bulk)",
        unit="modelled MB/s",
    )
    service = report.render_table(
        report.compare([c for c in cells if c.engine == "omap-aes-am335x"]),
        unit="modelled MB/s",
    )
    markdown = "\n\n".join(
        [
            "Stock bio-based dm-crypt vs request-based + bulk (modelled):",
            table,
            "This service's bio vs request modes on the bulk engine (modelled):",
            service,
        ]
    )
    plot = report.plot_png(
        _relabel(cells, _kernel_label),
        metric="modelled_mb_s",
        title="AM335x + SD, dd direct",
        published=_published_dd(512 << 10),
    )
    return ScenarioReport(markdown, plot, cells)


# ---------------------------------------------------------------------- sector-size


def _sector_jobs() -> list[dict[str, Any]]:
    size = 64 << 20
    sectors = size // 512
    tables = [
        _table("aes-cbc-essiv:sha256", 32, sectors),
        _table("aes-cbc-essiv:sha256", 32, sectors, " 1 sector_size:4096"),
    ]
    return [
        _job(
            "sector-size: mv-cesa + hdd-wd3000",
            _template(tables[0], size, "hdd-wd3000"),
            "mv-cesa",
            {"bs": "1M", "size": "16M", "iodepth": 1},
            table=tables,
            rw=["write", "read"],
            dispatch_mode=["bio", "request"],
        )
    ]


def _bio_units(size: int) -> Callable[[report.Cell], bool]:
    """Picks the bio-mode cells of one data unit size."""
    return lambda cell: cell["dispatch_mode"] == "bio" and cell["sector_size"] == size


def _sector_render(runs: Sequence[Run]) -> ScenarioReport:
    cells = _cells(runs)
    rows = report.compare(
        [c for c in cells if c.dispatch_mode == "bio"], axis="sector_size", base=512, other=4096
    )
    published = [
        (f"{PUBLISHED_SECTOR[512]:.1f}", f"{PUBLISHED_SECTOR[4096]:.1f}")
        if row.test == "write"
        else ("-", "-")
        for row in rows
    ]
    table = report.render_table(
        rows,
        base="512 B",
        other="4096 B",
        unit="modelled MB/s",
        extra=_published_columns(published, "512", "4096"),
    )
    modes = report.render_table(
        report.compare(cells, axis="sector_size", base=512, other=4096, ignore=()),
        base="512 B",
        other="4096 B",
        unit="modelled MB/s",
    )
    calls = _calls_table(cells, lambda c: f"{c.dispatch_mode}, {c.sector_size} B units")
    published_sector = [
        report.Published(
            "write",
            mb_s,
            _bio_units(size),
            size,
        )
        for size, mb_s in PUBLISHED_SECTOR.items()
    ]
    markdown = "\n\n".join(
        [
            "aes-cbc-essiv:sha256 on Marvell CESA (no bulk: one call per data unit), bio mode, "
            "dd 1 MiB, modelled, next to the published figures:",
            table,
            *_runs(cells, published_sector, lambda c: f"bio, {c.sector_size} B units"),
            "Both dispatch modes (a classic engine gains nothing from request mode):",
            modes,
            calls,
        ]
    )
    plot = report.plot_png(
        cells,
        metric="modelled_mb_s",
        title="mv-cesa + WD3000: data unit size",
        x_axis="sector_size",
        published=published_sector,
    )
    return ScenarioReport(markdown, plot, cells)


# ---------------------------------------------------------------------- bulk-vs-unit


def _xts_and_essiv(sectors: int) -> list[str]:
    """The bulk-derivable cipher next to the one whose IVs need the ESSIV key."""
    return [
        _table("aes-xts-plain64", 64, sectors),
        _table("aes-cbc-essiv:sha256", 32, sectors),
    ]


def _bulk_jobs() -> list[dict[str, Any]]:
    size = 64 << 20
    tables = _xts_and_essiv(size // 512)
    return [
        _job(
            "bulk-vs-unit: plain64-only engine",
            _template(tables[0], size, "sdcard-bbb"),
            PLAIN64_ENGINE,
            {"size": "8M", "iodepth": 8},
            table=tables,
            rw=["write", "read"],
            bs=["4k", "64k"],
            dispatch_mode=["bio", "request"],
        )
    ]


def _bulk_render(runs: Sequence[Run]) -> ScenarioReport:
    cells = _cells(runs)
    rows = report.compare(cells, ignore=())
    table = report.render_table(rows, unit="modelled MB/s")
    header = (
        "| cipher | mode | rw | bs | bulk applies | why not | bios | requests | engine calls |"
        " modelled MB/s |"
    )
    lines = [header, "|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        lines.append(
            f"| {c.cipher} | {c.dispatch_mode} | {c.rw} | {format_size(c.bs)} | "
            f"{'yes' if c.bulk_applies else 'no'} | {c.fallback_reason or ''} | "
            f"{c.bios} | {c.requests} | {c.engine_calls} | {c.modelled_mb_s:.2f} |"
        )
    markdown = "\n\n".join(
        [
            f"Engine `{PLAIN64_ENGINE}`: AM335x cost model, derives plain64 only, holds no IV key; "
            "sequential, 8 I/Os in flight (iodepth 8), modelled:",
            table,
            "\n".join(lines),
        ]
    )
    plot = report.plot_png(
        _by_cipher_and_mode(cells),
        metric="modelled_mb_s",
        title="bulk (xts-plain64) vs per-unit fallback (cbc-essiv), iodepth 8",
    )
    return ScenarioReport(markdown, plot, cells)


# ---------------------------------------------------------------------- concurrency


def _concurrency_jobs() -> list[dict[str, Any]]:
    return [
        _job(
            "concurrency: sequential 4k writers",
            _template(_table("aes-cbc-plain64", 16, _SD_SECTORS), _SD, "sdcard-bbb"),
            "omap-aes-am335x",
            {"rw": "write", "bs": "4k", "size": "4M"},
            iodepth=[1, 2, 4, 8, 16, 32],
            dispatch_mode=["bio", "request"],
        )
    ]


def _concurrency_render(runs: Sequence[Run]) -> ScenarioReport:
    cells = _cells(runs)
    table = report.render_table(report.compare(cells), unit="modelled MB/s")
    lines = [
        "| writers | mode | requests | avg request | request sizes (KiB: count) | engine calls |"
        " measured MB/s (host) | modelled MB/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        histogram = ", ".join(f"{k}: {v}" for k, v in c.request_size_histogram.items())
        lines.append(
            f"| {c.iodepth} | {c.dispatch_mode} | {c.requests} | "
            f"{c.avg_request_kib} KiB | {histogram} | {c.engine_calls} | "
            f"{c.measured_mb_s:.1f} | {c.modelled_mb_s:.2f} |"
        )
    markdown = "\n\n".join(
        [
            "N threads writing one sequential stream in 4 KiB bios (fio iodepth=N), "
            "AM335x + SD, modelled:",
            table,
            "\n".join(lines),
        ]
    )
    plot = report.plot_png(
        cells, metric="modelled_mb_s", title="4k sequential writers: merging", x_axis="iodepth"
    )
    return ScenarioReport(markdown, plot, cells)


# ---------------------------------------------------------------------- software


def _software_jobs() -> list[dict[str, Any]]:
    size = 64 << 20
    tables = _xts_and_essiv(size // 512)
    template = _template(tables[0], size, "none")
    rw, modes = ["write", "read"], ["bio", "request"]
    return [
        _job(
            "software: measured on this machine",
            template,
            "software",
            {"size": "16M", "iodepth": 1},
            table=tables,
            rw=rw,
            bs=["4k", "64k", "1M"],
            dispatch_mode=modes,
        ),
        _job(
            "software: 4k queued, measured on this machine",
            template,
            "software",
            {"size": "16M", "iodepth": 8, "bs": "4k"},
            table=tables,
            rw=rw,
            dispatch_mode=modes,
        ),
    ]


def _software_render(runs: Sequence[Run]) -> ScenarioReport:
    cells = _cells(runs)
    table = report.render_table(report.compare(cells, metric="measured_mb_s"), unit="measured MB/s")
    cpu = report.render_table(report.compare(cells, metric="cpu_s"), unit="CPU s")
    calls = _calls_table(cells, lambda c: f"{_short_cipher(c)} {c.dispatch_mode} qd {c.iodepth}")
    markdown = "\n\n".join(
        [
            "`software` engine (OpenSSL through pyca/cryptography), device `none` (a sparse "
            "file), measured wall-clock throughput of the in-process data path at iodepth 1 "
            "and, for 4k, iodepth 8 (8 threads):",
            table,
            "Process CPU (user + sys) per cell, measured:",
            cpu,
            calls,
        ]
    )
    plot = report.plot_png(
        _by_cipher_and_mode([c for c in cells if c.iodepth == 1]),
        metric="measured_mb_s",
        title="software engine on this host, iodepth 1 (measured)",
    )
    return ScenarioReport(markdown, plot, cells)


# ---------------------------------------------------------------------- dm-crypt flags


def _no_jobs() -> list[dict[str, Any]]:
    return []


def _split_table(points: Sequence[queuefit.SplitPoint]) -> str:
    sizes = list(dict.fromkeys(point.split_bytes for point in points))
    header = " | ".join(format_size(size) if size else "unsplit" for size in sizes)
    lines = [f"| variant | I/O | {header} |", "|---|---|" + "---|" * len(sizes)]
    rows: dict[tuple[str, str], list[float]] = {}
    for point in points:
        rows.setdefault((point.label, point.op), []).append(point.mb_per_s)
    for (label, op), values in rows.items():
        lines.append(f"| {label} | {op} | " + " | ".join(f"{v:.0f}" for v in values) + " |")
    return "\n".join(lines)


def _flags_render(runs: Sequence[Run]) -> ScenarioReport:
    """Modelled from the fitted queue platforms: nothing runs, the report is the model's."""
    blog = queuefit.predict(queuefit.QUEUE_CALIBRATIONS["blog"]).platform
    points = queuefit.split_sweep(blog)
    markdown = "\n\n".join(
        [
            "dm-crypt's queues, modelled: each source's per-hop cost is fitted on its stock "
            "figure alone; every other row is a prediction (docs/engines.md).",
            queuefit.render_markdown(),
            f"1 MiB I/O at queue depth 1 against max_read_size / max_write_size (6.11), "
            f"MB/s: the {blog.name} platform (aes-xts at its stated speed, hop "
            f"{blog.hop_ns / 1e3:.2f} µs) with the CPU counts named:",
            _split_table(points),
        ]
    )
    cells = [
        {
            "rw": point.op,
            "dispatch_mode": point.label,
            "max_size_kib": (point.split_bytes or 0) // 1024,
            "modelled_mb_s": point.mb_per_s,
        }
        for point in points
    ]
    plot = report.plot_png(
        cells,
        metric="modelled_mb_s",
        title="1 MiB I/O vs dm-crypt split size (KiB), modelled",
        x_axis="max_size_kib",
    )
    data = {
        "predictions": queuefit.predictions_json(),
        "split_sweep": [dataclasses.asdict(point) for point in points],
    }
    return ScenarioReport(markdown, plot, data=data)


SCENARIOS: dict[str, Scenario] = {
    scenario.name: scenario
    for scenario in (
        Scenario(
            "dd-512k",
            "dd 512 KiB direct, bio vs request, AM335x + SD (published figures)",
            _dd_jobs,
            _dd_render,
        ),
        Scenario("bs-sweep", "dd 4k..1M, bio vs request, AM335x + SD", _bs_jobs, _bs_render),
        Scenario(
            "sector-size",
            "cbc-essiv 512 vs 4096 B units, mv-cesa + WD3000",
            _sector_jobs,
            _sector_render,
        ),
        Scenario(
            "bulk-vs-unit",
            "xts-plain64 (bulk) vs cbc-essiv (fallback) on a plain64-only engine",
            _bulk_jobs,
            _bulk_render,
        ),
        Scenario(
            "concurrency",
            "1..32 sequential 4k writers, request sizes per mode",
            _concurrency_jobs,
            _concurrency_render,
        ),
        Scenario(
            "software",
            "the software engine, measured on this host",
            _software_jobs,
            _software_render,
        ),
        Scenario(
            "dm-crypt-flags",
            "dm-crypt's queues and flags: fitted on stock, predicted vs published; split sizes",
            _no_jobs,
            _flags_render,
        ),
    )
}


def scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise InvalidInput(f"unknown scenario {name!r}; built in: {', '.join(SCENARIOS)}") from None


def run_scenario(
    name: str,
    jobs: BenchmarkJobs,
    engines: EngineRegistry,
    progress: Callable[[str, float], None] | None = None,
) -> tuple[list[dict[str, Any]], ScenarioReport]:
    """Run every job of scenario ``name`` in this thread; returns the runs and the report."""
    chosen = scenario(name)
    install_engines(engines)
    runs = []
    for job in chosen.jobs():
        spec = JobSpec.from_dict(job)
        label = spec.label

        def step(fraction: float, label: str = label) -> None:
            if progress is not None:
                progress(label, fraction)

        run = jobs.run_now(spec, step)
        if run["state"] != "done":
            raise InvalidInput(f"scenario {name}: job {label!r} failed: {run['error']}")
        runs.append(run)
    return runs, chosen.render(runs)
