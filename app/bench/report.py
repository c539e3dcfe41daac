"""Results as the kernel thread showed them: tables with % change, CSV, JSON and plots.

Pure functions over cells as mappings (``cells.CellResult`` is one; SQL stores
them as dicts), so the API, the CLI and the docs render the same numbers the
same way. Plots use
matplotlib's Agg backend, imported lazily: headless and no start-up cost.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.bench.workload import format_size

Cell = Mapping[str, Any]

#: Columns of the CSV export, in order; everything a cell has that is a scalar.
CSV_COLUMNS = (
    "n",
    "dispatch_mode",
    "engine",
    "engine_measured",
    "device_model",
    "cipher",
    "sector_size",
    "bulk_applies",
    "rw",
    "bs",
    "iodepth",
    "numjobs",
    "bytes",
    "measured_mb_s",
    "modelled_mb_s",
    "iops",
    "p50_ms",
    "p99_ms",
    "cpu_s",
    "elapsed_s",
    "bios",
    "requests",
    "merges",
    "engine_calls",
    "bulk_calls",
    "unit_calls",
    "avg_request_kib",
    "modelled_ms",
    "crypto_ms",
    "storage_ms",
    "device_ios",
    "modelled_basis",
)

#: Axes that identify a test row; the compared axis is taken out of it.
ROW_AXES = ("rw", "bs", "engine", "cipher", "sector_size", "device_model", "iodepth", "numjobs")


def pct_change(base: float | None, new: float | None) -> float | None:
    """``(new - base) / base`` in percent; ``None`` when there is no baseline to divide by."""
    if base is None or new is None or base == 0:
        return None
    return (new - base) / base * 100.0


def format_pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1f}%"


@dataclass(frozen=True, slots=True)
class Row:
    test: str
    size: str
    base: float | None
    other: float | None

    @property
    def change(self) -> float | None:
        return pct_change(self.base, self.other)


def _varying(cells: Sequence[Cell], axes: Sequence[str]) -> list[str]:
    return [axis for axis in axes if len({repr(cell.get(axis)) for cell in cells}) > 1]


def _label(cell: Cell, axes: Sequence[str]) -> str:
    parts = [str(cell.get("rw"))]
    for axis in axes:
        value = cell.get(axis)
        if axis == "sector_size":
            parts.append(f"{value} B units")
        elif axis == "iodepth":
            parts.append(f"qd {value}")
        elif axis == "numjobs":
            parts.append(f"{value} jobs")
        else:
            parts.append(str(value))
    return " ".join(parts)


def compare(
    cells: Sequence[Cell],
    *,
    axis: str = "dispatch_mode",
    base: Any = "bio",
    other: Any = "request",
    metric: str = "modelled_mb_s",
    ignore: Sequence[str] = (),
) -> list[Row]:
    """One row per test (cells equal on every other axis), ``base`` vs ``other`` on ``axis``.

    ``ignore`` drops axes from the row key, to pair cells that differ on more
    than ``axis`` (e.g. stock dm-crypt's engine vs a bulk engine).
    """
    keyed: dict[tuple[Any, ...], dict[Any, Cell]] = {}
    row_axes = [a for a in ROW_AXES if a != axis and a not in ignore]
    for cell in cells:
        key = tuple(repr(cell.get(a)) for a in row_axes)
        keyed.setdefault(key, {})[cell.get(axis)] = cell
    shown = [a for a in _varying(cells, row_axes) if a not in ("rw", "bs")]
    rows = []
    for group in keyed.values():
        sample = next(iter(group.values()))
        first, second = group.get(base), group.get(other)
        rows.append(
            Row(
                test=_label(sample, shown),
                size=format_size(int(sample.get("bs", 0))),
                base=None if first is None else first.get(metric),
                other=None if second is None else second.get(metric),
            )
        )
    return rows


def render_table(
    rows: Sequence[Row],
    *,
    base: str = "bio",
    other: str = "request",
    unit: str = "MB/s",
    extra: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """A Markdown table like the kernel thread's: test | size | bio | request | % change.

    ``extra`` adds columns (header → one value per row), e.g. the published figures.
    """
    header = ["test", "size", f"{base} {unit}", f"{other} {unit}", "% change"]
    extra = extra or {}
    header += list(extra)
    lines = [
        [
            row.test,
            row.size,
            _num(row.base),
            _num(row.other),
            format_pct(row.change),
            *(values[index] for values in extra.values()),
        ]
        for index, row in enumerate(rows)
    ]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    out = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |"]
    out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for line in lines:
        out.append("| " + " | ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)) + " |")
    return "\n".join(out)


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def cells_csv(cells: Sequence[Cell]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for cell in cells:
        writer.writerow({column: cell.get(column) for column in CSV_COLUMNS})
    return buffer.getvalue()


def default_metric(cells: Sequence[Cell]) -> str:
    """Measured for measured engines (software), modelled for simulated hardware."""
    if cells and all(cell.get("engine_measured") for cell in cells):
        return "measured_mb_s"
    return "modelled_mb_s"


def plot_png(
    cells: Sequence[Cell],
    *,
    metric: str | None = None,
    title: str = "",
    x_axis: str = "bs",
) -> bytes:
    """Throughput vs ``x_axis`` (block size by default), one line per mode/engine/rw/cipher.

    Writes are dashed when the plot has both reads and writes.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    metric = metric or default_metric(cells)
    series_axes = [
        a
        for a in _varying(
            cells,
            ("dispatch_mode", "engine", "rw", "cipher", "sector_size", "bs", "iodepth", "numjobs"),
        )
        if a != x_axis
    ] or ["dispatch_mode"]
    categories = sorted({str(cell.get(x_axis)) for cell in cells})
    categorical = any(not isinstance(cell.get(x_axis), int | float) for cell in cells)
    series: dict[str, list[tuple[float, float]]] = {}
    writes: set[str] = set()
    for cell in cells:
        value = cell.get(metric)
        if value is None:
            continue
        label = " ".join(str(cell.get(a)) for a in series_axes)
        raw = cell.get(x_axis)
        x = float(categories.index(str(raw))) if categorical else float(raw or 0)
        series.setdefault(label, []).append((x, float(value)))
        if "write" in str(cell.get("rw")) and "rw" in series_axes:
            writes.add(label)
    figure = Figure(figsize=(7.5, 4.5), dpi=100)
    axes = figure.subplots()
    for label, points in sorted(series.items()):
        points.sort()
        axes.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            marker="o",
            linestyle="--" if label in writes else "-",
            label=label,
        )
    if categorical:
        axes.set_xticks(range(len(categories)), categories)
        axes.set_xlabel(x_axis)
        axes.set_xlim(-0.5, len(categories) - 0.5)
    elif x_axis == "bs":
        axes.set_xscale("log", base=2)
        ticks = sorted({int(cell.get("bs") or 0) for cell in cells if cell.get("bs")})
        axes.set_xticks(ticks, [format_size(t) for t in ticks])
        axes.set_xlabel("block size (bs)")
    else:
        axes.set_xlabel(x_axis)
        if x_axis in ("iodepth", "numjobs"):
            axes.set_xscale("log", base=2)
    kind = "measured" if metric.startswith("measured") else "modelled"
    axes.set_ylabel(f"{kind} MB/s")
    axes.set_title(title or f"throughput ({kind})")
    axes.grid(True, alpha=0.3)
    if series:
        axes.legend(fontsize=8)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
