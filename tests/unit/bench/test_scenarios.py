"""Each scenario's renderer over a canned run (``canned``: request mode doubles throughput,
reads are 1.5x writes, 4096-byte units 8x 512-byte ones, request mode halves CPU)."""

from __future__ import annotations

import pytest

from app.bench import scenarios
from tests.unit.bench.canned import canned_runs

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "name", sorted(name for name, scenario in scenarios.SCENARIOS.items() if scenario.jobs())
)
def test_every_scenario_pairs_all_its_cells_and_plots_them(name: str) -> None:
    scenario = scenarios.SCENARIOS[name]
    runs = canned_runs(scenario)
    rendered = scenario.render(runs)
    assert len(rendered.cells) == sum(len(run["cells"]) for run in runs)
    assert "% change" in rendered.markdown
    assert "n/a" not in rendered.markdown  # every row found both sides of its comparison
    assert rendered.plot.startswith(PNG)


def rows(markdown: str, first_cell: str) -> list[list[str]]:
    """The table rows whose first cell is ``first_cell``, as stripped cells."""
    found = []
    for line in markdown.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            found.append(cells)
    return found


def test_dd_512k_sets_stock_bio_against_bulk_request_beside_the_published_figures() -> None:
    rendered = scenarios.SCENARIOS["dd-512k"].render(canned_runs(scenarios.SCENARIOS["dd-512k"]))
    assert rows(rendered.markdown, "dd read") == [
        ["dd read", "512k", "3.00", "6.00", "+100.0%", "5.8", "13.0"]
    ]
    assert rows(rendered.markdown, "dd write") == [
        ["dd write", "512k", "2.00", "4.00", "+100.0%", "4.9", "9.2"]
    ]


def test_bs_sweep_has_a_row_per_rw_and_block_size() -> None:
    rendered = scenarios.SCENARIOS["bs-sweep"].render(canned_runs(scenarios.SCENARIOS["bs-sweep"]))
    kernel_table = rendered.markdown.split("This service's")[0]
    assert [row[1] for row in rows(kernel_table, "read")] == ["4k", "64k", "256k", "1M"]
    assert [row[1] for row in rows(kernel_table, "write")] == ["4k", "64k", "256k", "1M"]


def test_sector_size_compares_512_with_4096_byte_units_and_quotes_the_write_figures() -> None:
    rendered = scenarios.SCENARIOS["sector-size"].render(
        canned_runs(scenarios.SCENARIOS["sector-size"])
    )
    published = rendered.markdown.split("Both dispatch modes")[0]
    assert rows(published, "write") == [["write", "1M", "2.00", "16.00", "+700.0%", "12.9", "40.5"]]
    assert rows(published, "read") == [["read", "1M", "3.00", "24.00", "+700.0%", "-", "-"]]


def test_bulk_vs_unit_says_why_essiv_falls_back_on_the_plain64_engine() -> None:
    rendered = scenarios.SCENARIOS["bulk-vs-unit"].render(
        canned_runs(scenarios.SCENARIOS["bulk-vs-unit"])
    )
    xts = rows(rendered.markdown, "aes-xts-plain64")
    essiv = rows(rendered.markdown, "aes-cbc-essiv:sha256")
    assert len(xts) == len(essiv) == 8
    assert {row[4] for row in xts} == {"yes"}
    assert {(row[4], row[5]) for row in essiv} == {
        ("no", "IV mode essiv needs the IV key, which the engine does not hold")
    }


def test_concurrency_shows_request_sizes_per_writer_count() -> None:
    rendered = scenarios.SCENARIOS["concurrency"].render(
        canned_runs(scenarios.SCENARIOS["concurrency"])
    )
    eight = rows(rendered.markdown, "8")
    assert [row[1] for row in eight] == ["bio", "request"]
    assert eight[0][4] == "4k: 1024"
    assert eight[1][4] == "16k: 256"


def test_software_compares_measured_throughput_and_cpu_at_both_queue_depths() -> None:
    rendered = scenarios.SCENARIOS["software"].render(canned_runs(scenarios.SCENARIOS["software"]))
    throughput, cpu = rendered.markdown.split("Process CPU")
    assert rows(throughput, "read aes-xts-plain64 qd 8") == [
        ["read aes-xts-plain64 qd 8", "4k", "30.00", "60.00", "+100.0%"]
    ]
    assert rows(cpu, "write aes-cbc-essiv:sha256 qd 1") == [
        ["write aes-cbc-essiv:sha256 qd 1", size, "1.00", "0.50", "-50.0%"]
        for size in ("4k", "64k", "1M")
    ]


def test_dd_512k_runs_its_writes_as_long_as_the_publication_and_says_so() -> None:
    rendered = scenarios.SCENARIOS["dd-512k"].render(canned_runs(scenarios.SCENARIOS["dd-512k"]))
    writes = rows(rendered.markdown, "bio (stock dm-crypt, per-unit)")
    assert ["bio (stock dm-crypt, per-unit)", "write", "64M", "-", "2.00", "4.9", "64M"] in writes
    assert "Warning:" not in rendered.markdown


def test_dm_crypt_flags_is_modelled_without_jobs_and_shows_every_published_figure() -> None:
    scenario = scenarios.SCENARIOS["dm-crypt-flags"]
    assert scenario.jobs() == []
    rendered = scenario.render([])
    for config in ("same_cpu_crypt", "submit_from_crypt_cpus", "force_inline", "no_read_workqueue"):
        assert rows(rendered.markdown, config), config
    assert {row["role"] for row in rendered.data["predictions"]} == {"fitted", "held out"}
    assert rendered.plot.startswith(PNG)


def test_dm_crypt_flags_split_sweep_spreads_large_io_over_cpus_only_when_unbound() -> None:
    sweep = scenarios.SCENARIOS["dm-crypt-flags"].render([]).data["split_sweep"]

    def rate(label: str, op: str, size: int) -> float:
        (point,) = [
            p for p in sweep if (p["label"], p["op"], p["split_bytes"]) == (label, op, size)
        ]
        return float(point["mb_per_s"])

    for op in ("read", "write"):
        assert rate("16 CPUs", op, 128 << 10) > 2 * rate("16 CPUs", op, 1 << 20)
        assert rate("16 CPUs, same_cpu_crypt", op, 128 << 10) == rate("1 CPU", op, 128 << 10)
