"""The typed cell result: what is measured and what is modelled, and its persisted form."""

from __future__ import annotations

from dataclasses import fields

from app.bench import scenarios
from app.bench.cells import FIGURE_KINDS, CellResult
from app.bench.report import CSV_COLUMNS
from tests.unit.bench.canned import canned_runs


def a_cell() -> CellResult:
    run = canned_runs(scenarios.SCENARIOS["dd-512k"])[0]
    return CellResult.from_dict(run["cells"][0])


def test_a_cell_survives_its_persisted_form() -> None:
    cell = a_cell()
    assert CellResult.from_dict(cell.to_dict()) == cell


def test_a_cell_reads_as_a_mapping_of_its_fields() -> None:
    cell = a_cell()
    assert dict(cell) == cell.to_dict()
    assert cell["engine"] == cell.engine
    assert cell.get("no_such_figure") is None


def test_every_throughput_latency_and_time_figure_says_measured_or_modelled() -> None:
    assert FIGURE_KINDS["measured_mb_s"] == "measured"
    assert FIGURE_KINDS["modelled_mb_s"] == "modelled"
    assert {"crypto_ms", "storage_ms", "modelled_ms"} <= {
        name for name, kind in FIGURE_KINDS.items() if kind == "modelled"
    }
    assert set(FIGURE_KINDS) <= {f.name for f in fields(CellResult)}


def test_the_csv_columns_are_cell_fields() -> None:
    assert set(CSV_COLUMNS) <= {f.name for f in fields(CellResult)}
