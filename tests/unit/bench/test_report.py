"""Tables like the kernel thread's, % change math, CSV, and plots a reader takes in at a glance."""

from __future__ import annotations

import csv
import io

import pytest
from matplotlib.container import ErrorbarContainer

from app.bench import report
from app.bench.report import cells_csv, compare, format_pct, pct_change, render_table


def cell(mode: str, rw: str, bs: int, value: float, **extra: object) -> dict[str, object]:
    return {"dispatch_mode": mode, "rw": rw, "bs": bs, "modelled_mb_s": value, **extra}


@pytest.mark.parametrize(
    ("base", "new", "expected"),
    [(5.8, 13.0, 124.1379), (10.0, 5.0, -50.0), (4.0, 4.0, 0.0)],
)
def test_pct_change(base: float, new: float, expected: float) -> None:
    assert pct_change(base, new) == pytest.approx(expected, rel=1e-4)


def test_pct_change_without_a_baseline_is_none() -> None:
    assert pct_change(0.0, 3.0) is None
    assert pct_change(None, 3.0) is None
    assert format_pct(None) == "n/a"
    assert format_pct(124.137) == "+124.1%"
    assert format_pct(-3.04) == "-3.0%"


def test_compare_pairs_bio_and_request_per_test() -> None:
    cells = [
        cell("bio", "read", 524288, 5.8),
        cell("request", "read", 524288, 13.0),
        cell("bio", "write", 524288, 4.9),
        cell("request", "write", 524288, 9.2),
    ]
    rows = compare(cells)
    assert [(r.test, r.size, r.base, r.other) for r in rows] == [
        ("read", "512k", 5.8, 13.0),
        ("write", "512k", 4.9, 9.2),
    ]


def test_compare_names_the_axes_that_vary() -> None:
    cells = [cell(m, "write", 4096, 1.0, iodepth=q) for m in ("bio", "request") for q in (1, 8)]
    assert [row.test for row in compare(cells)] == ["write qd 1", "write qd 8"]


def test_ignore_pairs_cells_across_another_axis() -> None:
    cells = [
        cell("bio", "read", 4096, 2.0, engine="stock"),
        cell("request", "read", 4096, 3.0, engine="bulk"),
    ]
    assert len(compare(cells)) == 2
    (row,) = compare(cells, ignore=("engine",))
    assert (row.base, row.other) == (2.0, 3.0)


def test_a_missing_side_renders_as_a_dash() -> None:
    (row,) = compare([cell("bio", "read", 4096, 2.0)])
    assert row.other is None
    assert "| -" in render_table([row])


def test_render_table_has_the_kernel_thread_columns() -> None:
    rows = compare([cell("bio", "read", 524288, 5.8), cell("request", "read", 524288, 13.0)])
    text = render_table(rows, extra={"published": ["13.0"]})
    header, rule, line = text.splitlines()
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "test",
        "size",
        "bio MB/s",
        "request MB/s",
        "% change",
        "published",
    ]
    assert set(rule) <= {"|", "-"}
    assert [c.strip() for c in line.strip("|").split("|")] == [
        "read",
        "512k",
        "5.80",
        "13.00",
        "+124.1%",
        "13.0",
    ]


def test_csv_has_one_row_per_cell_and_the_contract_columns() -> None:
    text = cells_csv(
        [cell("bio", "read", 4096, 1.5, engine_calls=8), cell("request", "read", 4096, 2.5)]
    )
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [row["dispatch_mode"] for row in rows] == ["bio", "request"]
    assert rows[0]["engine_calls"] == "8"
    assert {"measured_mb_s", "modelled_mb_s", "p99_ms", "cpu_s"} <= set(rows[0])


def sweep_cells(measured: bool = False) -> list[dict]:
    """bio/request x read/write x 4k/64k, each value unique so a line names its series."""
    cells = []
    for rw_index, rw in enumerate(("read", "write")):
        for mode_index, mode in enumerate(("bio", "request")):
            for bs_index, bs in enumerate((4096, 65536)):
                value = 10.0 * (1 + rw_index * 4 + mode_index * 2 + bs_index)
                cells.append(
                    {
                        "rw": rw,
                        "dispatch_mode": mode,
                        "engine": "omap-aes-am335x",
                        "engine_measured": measured,
                        "bs": bs,
                        "modelled_mb_s": value,
                        "measured_mb_s": value / 2,
                    }
                )
    return cells


def line_with(axes, ys):
    (line,) = [line for line in axes.get_lines() if list(line.get_ydata()) == ys]
    return line


def test_plot_puts_read_and_write_in_separate_panels():
    figure = report.plot_figure(sweep_cells())
    assert [axes.get_title() for axes in figure.axes] == ["read", "write"]
    read, write = figure.axes
    assert len(read.get_lines()) == len(write.get_lines()) == 2


def test_plot_gives_a_variant_one_colour_in_every_panel_and_its_own_line_style():
    read, write = report.plot_figure(sweep_cells()).axes
    bio_read, bio_write = line_with(read, [10.0, 20.0]), line_with(write, [50.0, 60.0])
    request_read = line_with(read, [30.0, 40.0])
    assert bio_read.get_color() == bio_write.get_color()
    assert bio_read.get_color() != request_read.get_color()
    # Equal curves must not hide each other: styles and widths differ too.
    assert bio_read.get_linestyle() != request_read.get_linestyle()
    assert bio_read.get_linewidth() > request_read.get_linewidth()


def test_plot_legend_sits_outside_the_data():
    figure = report.plot_figure(sweep_cells())
    assert all(axes.get_legend() is None for axes in figure.axes)
    (legend,) = figure.legends
    assert [text.get_text() for text in legend.get_texts()] == ["bio", "request"]
    figure.canvas.draw()
    box = legend.get_window_extent()
    assert not any(box.overlaps(axes.get_window_extent()) for axes in figure.axes)


@pytest.mark.parametrize(("measured", "kind"), [(False, "modelled"), (True, "measured")])
def test_plot_axis_says_measured_or_modelled(measured, kind):
    figure = report.plot_figure(sweep_cells(measured))
    assert figure.axes[0].get_ylabel() == f"{kind} MB/s"


def test_published_figures_are_markers_beside_their_variant():
    published = [
        report.Published("write", 42.0, lambda cell: cell["dispatch_mode"] == "request", 65536)
    ]
    figure = report.plot_figure(sweep_cells(), published=published)
    read, write = figure.axes
    marker = line_with(write, [42.0])
    assert marker.get_marker() == "D"
    assert marker.get_markerfacecolor() == "none"
    assert marker.get_color() == line_with(write, [70.0, 80.0]).get_color()
    x = marker.get_xdata()[0]
    assert 65536 < x < 65536 * 1.2
    assert not [line for line in read.get_lines() if line.get_marker() == "D"]
    labels = [text.get_text() for text in figure.legends[0].get_texts()]
    assert labels[-1] == "published figure"


def test_an_rw_axis_draws_one_bar_per_variant_per_panel():
    cells = [c for c in sweep_cells() if c["bs"] == 4096]
    read, write = report.plot_figure(cells, x_axis="rw").axes
    assert [bar.get_height() for bar in read.patches] == [10.0, 30.0]
    assert [bar.get_height() for bar in write.patches] == [50.0, 70.0]
    assert read.patches[0].get_facecolor() == write.patches[0].get_facecolor()


def test_plot_png_is_a_png():
    assert report.plot_png(sweep_cells()).startswith(b"\x89PNG\r\n\x1a\n")


def with_intervals(cells):
    return [
        {
            **c,
            "modelled_mb_s_low": c["modelled_mb_s"] - 1,
            "modelled_mb_s_high": c["modelled_mb_s"] + 2,
        }
        for c in cells
    ]


def test_cells_with_intervals_get_error_bars():
    read, _ = report.plot_figure(with_intervals(sweep_cells())).axes
    bars = [c for c in read.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 2
    _, _, (ranges,) = bars[0].lines
    first = ranges.get_segments()[0]
    assert [float(y) for y in first[:, 1]] == [9.0, 12.0]


def test_series_sit_apart_so_no_marker_hides_another():
    read, _ = report.plot_figure(sweep_cells()).axes
    bio_x = line_with(read, [10.0, 20.0]).get_xdata()
    request_x = line_with(read, [30.0, 40.0]).get_xdata()
    assert bio_x[0] < 4096 < request_x[0] < 4096 * 1.1


def test_values_spanning_decades_get_a_log_axis_and_close_ones_do_not():
    spread = [{**c, "modelled_mb_s": c["modelled_mb_s"] ** 2} for c in sweep_cells()]
    assert report.plot_figure(spread).axes[0].get_yscale() == "log"
    assert report.plot_figure(sweep_cells()).axes[0].get_yscale() == "linear"


def test_the_title_names_cipher_engine_block_size_and_depth():
    cells = [{**c, "cipher": "aes-cbc-plain64", "iodepth": 4} for c in sweep_cells()]
    title = report.plot_figure(cells, title="sweep").get_suptitle()
    assert title == "sweep\naes-cbc-plain64, omap-aes-am335x engine, bs 4k-64k, iodepth 4"


def test_a_failed_run_says_so_across_the_plot():
    figure = report.plot_figure([], failure="engine x cannot run cell 0")
    assert figure.get_suptitle().startswith("FAILED: ")
    assert "run failed: engine x cannot run cell 0" in [t.get_text() for t in figure.texts]


def test_bars_name_their_category_baseline_first_with_values():
    cells = [
        {**c, "dispatch_mode": name}
        for c, name in zip(
            [c for c in sweep_cells() if c["bs"] == 4096 and c["rw"] == "read"],
            ["request (bulk engine)", "bio (stock dm-crypt)"],
            strict=True,
        )
    ]
    (read,) = report.plot_figure(cells, x_axis="rw").axes
    assert [t.get_text() for t in read.get_xticklabels()] == [
        "bio\n(stock dm-crypt)",
        "request\n(bulk engine)",
    ]
    assert [t.get_text() for t in read.texts] == ["30.00", "10.00"]


def buffered_writes() -> list[dict[str, object]]:
    return [
        cell("bio", "write", 512 << 10, 4.8, bytes=64 << 20, write_regime="burst"),
        cell("bio", "write", 512 << 10, 3.1, bytes=1 << 30, write_regime="burst+sustained"),
    ]


def published_write(run_bytes: int | None) -> report.Published:
    return report.Published("write", 4.9, lambda c: c["dispatch_mode"] == "bio", None, run_bytes)


def test_the_runs_table_gives_each_cells_run_length_and_regime_beside_the_figure() -> None:
    table = report.render_runs(buffered_writes(), [published_write(64 << 20)], lambda c: "bio")
    lines = [line.split("|")[1:-1] for line in table.splitlines()[2:]]
    assert [[value.strip() for value in line] for line in lines] == [
        ["bio", "write", "64M", "burst", "4.80", "4.9", "64M"],
        ["bio", "write", "1G", "burst+sustained", "3.10", "4.9", "64M"],
    ]


def test_a_run_longer_than_the_publications_is_warned_about_and_an_equal_one_is_not() -> None:
    warnings = report.run_length_warnings(
        buffered_writes(), [published_write(64 << 20)], lambda c: "bio"
    )
    assert len(warnings) == 1
    assert "ran 1G (burst+sustained)" in warnings[0]
    assert "ran 64M" in warnings[0]


def test_a_figure_whose_run_length_is_not_stated_warns_about_nothing() -> None:
    assert report.run_length_warnings(buffered_writes(), [published_write(None)], str) == []
