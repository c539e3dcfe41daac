"""Results as the kernel thread showed them: tables with % change, CSV, JSON and plots.

Pure functions over cells as mappings (``cells.CellResult`` is one; SQL stores
them as dicts), so the API, the CLI and the docs render the same numbers the
same way. Plots use
matplotlib's Agg backend, imported lazily: headless and no start-up cost.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.sizes import format_size

if TYPE_CHECKING:
    from matplotlib.figure import Figure

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
    "write_regime",
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


def _style(index: int) -> dict[str, Any]:
    """Line style, marker and width per series: equal curves stay visible, the first widest."""
    return {
        "linestyle": ("-", "--", ":", "-.")[index % 4],
        "marker": ("o", "s", "^", "v", "P", "X")[index % 6],
        "linewidth": max(1.2, 3.6 - 0.8 * index),
        "markersize": max(4.0, 9.0 - 1.5 * index),
    }


@dataclass(frozen=True, slots=True)
class Published:
    """A figure from a paper or mailing-list thread, drawn beside the series it reproduces.

    ``where`` picks that series' cells; ``x`` is its position on the plot's x axis
    (ignored when the x axis is ``rw``: one bar per series).
    """

    rw: str
    mb_s: float
    where: Callable[[Cell], bool]
    x: Any = None


#: Numeric x axes drawn on a log2 scale (``bs`` too, with size labels).
LOG2_AXES = ("bs", "iodepth", "numjobs", "sector_size")

#: Panels, in order: a cell goes to the first whose words its ``rw`` has alone.
PANELS = ("read", "write", "mixed")


def _panel(rw: object) -> str:
    text = str(rw)
    if "read" in text and "write" not in text:
        return "read"
    if "write" in text and "read" not in text:
        return "write"
    return "mixed"


def plot_figure(
    cells: Sequence[Cell],
    *,
    metric: str | None = None,
    title: str = "",
    x_axis: str = "bs",
    published: Sequence[Published] = (),
) -> Figure:
    """Throughput vs ``x_axis``: read and write in separate panels, one colour per variant.

    A variant (series) is every other axis that varies, so its colour is the same
    in every panel; published figures are hollow diamonds in their variant's
    colour; the legend sits outside the data. With ``x_axis="rw"`` each panel
    shows one bar per variant.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    metric = metric or default_metric(cells)
    kind = "measured" if metric.startswith("measured") else "modelled"
    bars = x_axis == "rw"
    candidates = ("dispatch_mode", "engine", "cipher", "sector_size", "bs", "iodepth", "numjobs")
    series_axes = [a for a in _varying(cells, candidates) if a != x_axis] or ["dispatch_mode"]
    plotted = [cell for cell in cells if cell.get(metric) is not None]

    def label(cell: Cell) -> str:
        return " ".join(str(cell.get(a)) for a in series_axes)

    labels = sorted({label(cell) for cell in plotted})
    palette = matplotlib.color_sequences["tab10"]
    colour = {name: palette[index % len(palette)] for index, name in enumerate(labels)}
    panels = [p for p in PANELS if any(_panel(c.get("rw")) == p for c in plotted)] or ["read"]
    categorical = not bars and any(
        not isinstance(cell.get(x_axis), int | float) for cell in plotted
    )
    categories = sorted({str(cell.get(x_axis)) for cell in plotted})

    def position(raw: Any) -> float:
        return float(categories.index(str(raw))) if categorical else float(raw or 0)

    figure = Figure(figsize=(3.2 + 3.6 * len(panels), 4.2), dpi=100, layout="constrained")
    axes_row = figure.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    for axes, panel in zip(axes_row, panels, strict=True):
        in_panel = [c for c in plotted if _panel(c.get("rw")) == panel]
        for index, name in enumerate(labels):
            points = sorted(
                (position(c.get(x_axis)) if not bars else float(index), float(c[metric]))
                for c in in_panel
                if label(c) == name
            )
            if not points:
                continue
            if bars:
                axes.bar(index, points[0][1], width=0.6, color=colour[name])
            else:
                axes.plot(*zip(*points, strict=True), color=colour[name], **_style(index))
        for figure_ in published:
            if _panel(figure_.rw) != panel:
                continue
            owners = [label(c) for c in in_panel if figure_.where(c)]
            if not owners:
                continue
            owner = owners[0]
            # Beside the modelled point, not on it, so both stay readable.
            if bars:
                x = labels.index(owner) + 0.4
            elif categorical:
                x = position(figure_.x) + 0.15
            else:
                x = position(figure_.x) * (1.1 if x_axis in LOG2_AXES else 1.0)
            axes.plot(
                [x],
                [figure_.mb_s],
                linestyle="none",
                marker="D",
                markersize=8,
                markerfacecolor="none",
                markeredgewidth=2,
                color=colour[owner],
            )
        axes.set_title(panel)
        axes.grid(True, alpha=0.3)
        if bars:
            axes.set_xticks([])
            axes.set_xlim(-0.6, len(labels) - 0.2)
        elif categorical:
            axes.set_xticks(range(len(categories)), categories)
            axes.set_xlim(-0.5, len(categories) - 0.5)
            axes.set_xlabel(x_axis)
        elif x_axis == "bs":
            axes.set_xscale("log", base=2)
            ticks = sorted({int(c.get("bs") or 0) for c in plotted if c.get("bs")})
            axes.set_xticks(ticks, [format_size(t) for t in ticks])
            axes.set_xlabel("block size (bs)")
        else:
            axes.set_xlabel(x_axis)
            if x_axis in LOG2_AXES:
                axes.set_xscale("log", base=2)
                ticks = sorted({int(c.get(x_axis) or 0) for c in plotted if c.get(x_axis)})
                axes.set_xticks(ticks, [str(t) for t in ticks])
    axes_row[0].set_ylabel(f"{kind} MB/s")
    figure.suptitle(title or f"throughput ({kind})")
    handles = [
        Line2D([], [], color=colour[name], label=name, **({} if bars else _style(index)))
        for index, name in enumerate(labels)
    ]
    if published:
        handles.append(
            Line2D(
                [],
                [],
                linestyle="none",
                marker="D",
                markerfacecolor="none",
                markeredgewidth=2,
                color="black",
                label="published figure",
            )
        )
    if handles:
        figure.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)
    return figure


def plot_png(
    cells: Sequence[Cell],
    *,
    metric: str | None = None,
    title: str = "",
    x_axis: str = "bs",
    published: Sequence[Published] = (),
) -> bytes:
    """``plot_figure`` as PNG bytes: what the API, the CLI and docs/img serve."""
    figure = plot_figure(cells, metric=metric, title=title, x_axis=x_axis, published=published)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
