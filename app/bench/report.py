"""Results as the kernel thread showed them: tables with % change, CSV, JSON and plots.

Pure functions over cells as mappings (``cells.CellResult`` is one; SQL stores
them as dicts), so the API, the CLI and the docs render the same numbers the
same way. Plots use
matplotlib's Agg backend, imported lazily: headless and no start-up cost.
"""

from __future__ import annotations

import csv
import io
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from typing_extensions import Unpack

from app.bench.stats import Ratio, median_interval, ratio_interval
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
    "queue_ms",
    "storage_ms",
    "device_ios",
    "write_regime",
    "modelled_basis",
    "rounds",
    "coverage",
    "measured_mb_s_low",
    "measured_mb_s_high",
    "modelled_mb_s_low",
    "modelled_mb_s_high",
    "warnings",
)

#: Columns a replayed trace's cells add (``app.bench.replay``), after the others so a
#: column keeps its place whatever the run was.
REPLAY_CSV_COLUMNS = ("engine_calls_per_bio", "wareq_sz", "rareq_sz", "p90_ms")

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
    """One comparison; with per-round figures on both sides it has intervals and a ratio."""

    test: str
    size: str
    base: float | None
    other: float | None
    base_rounds: tuple[float, ...] = ()
    other_rounds: tuple[float, ...] = ()

    @property
    def change(self) -> float | None:
        return pct_change(self.base, self.other)

    @property
    def ratio(self) -> Ratio | None:
        if len(self.base_rounds) < 2 or len(self.other_rounds) < 2:
            return None
        return ratio_interval(self.base_rounds, self.other_rounds)


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
                base_rounds=_rounds(first, metric),
                other_rounds=_rounds(second, metric),
            )
        )
    return rows


def _rounds(cell: Cell | None, metric: str) -> tuple[float, ...]:
    if cell is None:
        return ()
    return tuple(cell.get(f"{metric}_rounds") or ())


def _with_interval(value: float | None, rounds: Sequence[float]) -> str:
    """``123 [118, 130]``: the median and its interval, when there are rounds to have one."""
    if value is None or len(rounds) < 2:
        return _num(value)
    estimate = median_interval(rounds)
    return f"{_num(value)} [{_num(estimate.low)}, {_num(estimate.high)}]"


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
    ratios = [row.ratio for row in rows]
    header = ["test", "size", f"{base} {unit}", f"{other} {unit}", "% change"]
    if any(ratios):
        header[2:4] = [f"{base} {unit} [95 % CI]", f"{other} {unit} [95 % CI]"]
        header.append(f"{other}/{base} [95 % CI]")
    extra = extra or {}
    header += list(extra)
    lines = [
        [
            row.test,
            row.size,
            _with_interval(row.base, row.base_rounds),
            _with_interval(row.other, row.other_rounds),
            format_pct(row.change),
            *([ratio.describe() if ratio else "-"] if any(ratios) else []),
            *(values[index] for values in extra.values()),
        ]
        for index, (row, ratio) in enumerate(zip(rows, ratios, strict=True))
    ]
    return _markdown(header, lines)


def _markdown(header: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    out = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |"]
    out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for line in lines:
        out.append("| " + " | ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)) + " |")
    return "\n".join(out)


def _compared(cell: Cell, figure: Published) -> bool:
    return _panel(cell["rw"]) == _panel(figure.rw) and figure.where(cell)


def render_runs(
    cells: Sequence[Cell],
    published: Sequence[Published],
    label: Callable[[Cell], str],
    metric: str = "modelled_mb_s",
) -> str:
    """Each cell compared with a published figure: how long it ran and in which regime of
    the device's write buffer, beside the figure and the run length it was published for."""
    lines = [
        [
            label(cell),
            str(cell["rw"]),
            format_size(int(cell["bytes"])),
            str(cell.get("write_regime") or "-"),
            _num(cell.get(metric)),
            f"{figure.mb_s:g}",
            "-" if figure.run_bytes is None else format_size(figure.run_bytes),
        ]
        for figure in published
        for cell in cells
        if _compared(cell, figure)
    ]
    header = ["cell", "rw", "run", "write regime", metric.removesuffix("_mb_s") + " MB/s"]
    header.append("published MB/s")
    return _markdown([*header, "published run"], lines)


def run_length_warnings(
    cells: Sequence[Cell], published: Sequence[Published], label: Callable[[Cell], str]
) -> list[str]:
    """A warning for each cell that ran a different length from the figure it is compared
    with: a device with a write buffer takes a short run at its burst rate and a long one
    mostly at its sustained rate, so the two may not be the same experiment."""
    return [
        f"{label(cell)}, {cell['rw']}: ran {format_size(int(cell['bytes']))} "
        f"({cell.get('write_regime') or 'no buffered writes'}), the published "
        f"{figure.mb_s:g} MB/s ran {format_size(figure.run_bytes)}: compare with care"
        for figure in published
        if figure.run_bytes is not None
        for cell in cells
        if _compared(cell, figure) and int(cell["bytes"]) != figure.run_bytes
    ]


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def cells_csv(cells: Sequence[Cell]) -> str:
    """One row per cell; a replay's cells also carry ``REPLAY_CSV_COLUMNS``."""
    replayed = any(cell.get("modelled_basis") == "replay" for cell in cells)
    columns: tuple[str, ...] = CSV_COLUMNS + REPLAY_CSV_COLUMNS if replayed else CSV_COLUMNS
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    for cell in cells:
        row = {column: cell.get(column) for column in columns}
        row["warnings"] = "; ".join(cell.get("warnings") or ())
        writer.writerow(row)
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
    (ignored when the x axis is ``rw``: one bar per series); ``run_bytes`` its run length.
    """

    rw: str
    mb_s: float
    where: Callable[[Cell], bool]
    x: Any = None
    run_bytes: int | None = None
    """How much the publication's run moved (None: not stated, or no write buffer to fill)."""


#: Numeric x axes drawn on a log2 scale (``bs`` too, with size labels).
LOG2_AXES = ("bs", "iodepth", "numjobs", "sector_size", "max_size_kib")

#: Panels, in order: a cell goes to the first whose words its ``rw`` has alone.
PANELS = ("read", "write", "mixed")


def _panel(rw: object) -> str:
    text = str(rw)
    if "read" in text and "write" not in text:
        return "read"
    if "write" in text and "read" not in text:
        return "write"
    return "mixed"


def _baseline_first(label: str) -> tuple[int, str]:
    """Series order: the baseline (bio, stock dm-crypt) before what is compared with it."""
    return (0 if "stock" in label else 1 if label.startswith("bio") else 2, label)


def _interval(cell: Cell, metric: str) -> tuple[float, float] | None:
    low, high = cell.get(f"{metric}_low"), cell.get(f"{metric}_high")
    if low is None or high is None:
        return None
    return float(low), float(high)


def describe_cells(cells: Sequence[Cell]) -> str:
    """What a plot's title names: cipher, engine, block size and depth (ranges when swept)."""

    def values(axis: str) -> list[Any]:
        return sorted({cell.get(axis) for cell in cells if cell.get(axis) is not None}, key=str)

    parts = []
    for axis, show in (
        ("cipher", str),
        ("engine", lambda v: f"{v} engine"),
        ("bs", lambda v: f"bs {format_size(int(v))}"),
        ("iodepth", lambda v: f"iodepth {v}"),
    ):
        found = values(axis)
        if len(found) == 1:
            parts.append(show(found[0]))
        elif axis == "bs" and found:
            sizes = sorted(int(v) for v in found)
            parts.append(f"bs {format_size(sizes[0])}-{format_size(sizes[-1])}")
        elif found:
            parts.append(f"{len(found)} {axis}s")
    return ", ".join(parts)


def plot_figure(
    cells: Sequence[Cell],
    *,
    metric: str | None = None,
    title: str = "",
    x_axis: str = "bs",
    published: Sequence[Published] = (),
    failure: str | None = None,
) -> Figure:
    """Throughput vs ``x_axis``: read and write in separate panels, one colour per variant.

    A variant (series) is every other axis that varies, so its colour is the same
    in every panel, the baseline first; a cell with an interval gets an error
    bar, and series sit a little apart on the x axis so no marker hides another.
    Published figures are hollow diamonds in their variant's colour; the legend
    sits under the panels. With ``x_axis="rw"`` each panel shows one labelled bar
    per variant with its value. Values spanning more than a decade get a log y
    axis. ``failure`` (a failed run's error) is written across the figure.
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

    labels = sorted({label(cell) for cell in plotted}, key=_baseline_first)
    palette = matplotlib.color_sequences["tab10"]
    colour = {name: palette[index % len(palette)] for index, name in enumerate(labels)}
    panels = [p for p in PANELS if any(_panel(c.get("rw")) == p for c in plotted)] or ["read"]
    categorical = not bars and any(
        not isinstance(cell.get(x_axis), int | float) for cell in plotted
    )
    categories = sorted({str(cell.get(x_axis)) for cell in plotted})
    logarithmic_x = not categorical and x_axis in LOG2_AXES
    values = [float(c[metric]) for c in plotted if float(c[metric]) > 0]
    log_y = bool(values) and max(values) / min(values) > 10

    def position(raw: Any, index: int) -> float:
        """The x of series ``index``: spread a little either side of the category or size."""
        shift = (index - (len(labels) - 1) / 2) * 0.06
        if categorical:
            return categories.index(str(raw)) + shift
        base = float(raw or 0)
        return base * 2**shift if logarithmic_x else base + shift

    width = 3.2 + 3.6 * len(panels)
    figure = Figure(figsize=(width, 4.6), dpi=100, layout="constrained")
    axes_row = figure.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    for axes, panel in zip(axes_row, panels, strict=True):
        in_panel = [c for c in plotted if _panel(c.get("rw")) == panel]
        for index, name in enumerate(labels):
            series = sorted(
                (c for c in in_panel if label(c) == name),
                key=lambda c: float(index) if bars else position(c.get(x_axis), index),
            )
            if not series:
                continue
            ys = [float(c[metric]) for c in series]
            intervals = [_interval(c, metric) for c in series]
            errors = [
                [y - i[0] if i else 0.0 for y, i in zip(ys, intervals, strict=True)],
                [i[1] - y if i else 0.0 for y, i in zip(ys, intervals, strict=True)],
            ]
            has_errors = any(i is not None for i in intervals)
            if bars:
                container = axes.bar(
                    index,
                    ys[0],
                    width=0.6,
                    color=colour[name],
                    yerr=[[errors[0][0]], [errors[1][0]]] if has_errors else None,
                    capsize=4,
                )
                axes.bar_label(container, labels=[_num(ys[0])], padding=2, fontsize=8)
                continue
            xs = [position(c.get(x_axis), index) for c in series]
            axes.plot(xs, ys, color=colour[name], **_style(index))
            if has_errors:
                axes.errorbar(
                    xs, ys, yerr=errors, fmt="none", ecolor=colour[name], capsize=3, linewidth=1
                )
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
                x = position(figure_.x, labels.index(owner)) + 0.15
            else:
                x = position(figure_.x, labels.index(owner)) * (1.1 if logarithmic_x else 1.0)
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
        if log_y:
            axes.set_yscale("log")
        if bars:
            wrapped = [name.replace(" (", "\n(").replace(") ", ")\n") for name in labels]
            axes.set_xticks(range(len(labels)), wrapped, fontsize=8)
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
    rounds = max((int(c.get("rounds") or 1) for c in plotted), default=1)
    statistic = f", median of {rounds} rounds, 95 % CI" if rounds > 1 else ""
    axes_row[0].set_ylabel(f"{kind} MB/s{statistic}")
    heading = title or f"throughput ({kind})"
    described = describe_cells(cells)
    if described and described not in heading:
        heading = f"{heading}\n{described}"
    if failure is not None:
        heading = f"FAILED: {heading}"
        figure.text(
            0.5,
            0.5,
            textwrap.fill(f"run failed: {failure}", width=int(width * 8)),
            ha="center",
            va="center",
            color="firebrick",
            fontsize=11,
            bbox={"facecolor": "white", "edgecolor": "firebrick"},
        )
    figure.suptitle(heading, fontsize=10)
    # Bars carry their names on the x axis; a legend would only repeat them.
    handles = [
        Line2D([], [], color=colour[name], label=name, **_style(index))
        for index, name in enumerate(labels)
        if not bars
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
        figure.legend(
            handles=handles,
            loc="outside lower center",
            ncols=min(len(handles), 4),
            fontsize=8,
            frameon=False,
        )
    return figure


class PlotOptions(TypedDict, total=False):
    """``plot_figure``'s keyword arguments, passed on unchanged by ``plot_png``."""

    metric: str | None
    title: str
    x_axis: str
    published: Sequence[Published]
    failure: str | None


def plot_png(cells: Sequence[Cell], **options: Unpack[PlotOptions]) -> bytes:
    """``plot_figure`` as PNG bytes: what the API, the CLI and docs/img serve."""
    figure = plot_figure(cells, **options)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
