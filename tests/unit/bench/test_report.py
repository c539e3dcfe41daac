"""Tables like the kernel thread's, % change math, CSV."""

from __future__ import annotations

import csv
import io

import pytest

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
