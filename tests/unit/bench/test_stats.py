"""Repeated rounds summed up: medians with intervals, ratios with theirs, warnings."""

from __future__ import annotations

import pytest

from app.bench import report
from app.bench.stats import cell_warnings, median_interval, ratio_interval


def test_six_rounds_give_min_to_max_at_969_percent() -> None:
    estimate = median_interval([5.0, 1.0, 3.0, 4.0, 2.0, 6.0])
    assert (estimate.median, estimate.low, estimate.high) == (3.5, 1.0, 6.0)
    assert estimate.coverage == pytest.approx(0.9688, abs=1e-4)


def test_many_rounds_drop_the_extremes_from_the_interval() -> None:
    estimate = median_interval([float(v) for v in range(1, 21)])
    assert (estimate.low, estimate.high) == (6.0, 15.0)
    assert estimate.coverage >= 0.95


def test_five_rounds_cannot_reach_95_percent_and_say_so() -> None:
    estimate = median_interval([10.0, 10.1, 10.2, 10.1, 10.0])
    assert estimate.coverage == pytest.approx(0.9375)
    assert any("covers only 94 %" in w for w in cell_warnings(estimate, 1.0, measured=True))


def test_a_short_round_and_a_wide_interval_are_warned_about() -> None:
    estimate = median_interval([50.0, 100.0, 100.0, 100.0, 100.0, 150.0])
    warnings = cell_warnings(estimate, 0.05, measured=True)
    assert [w.split(":")[0] for w in warnings] == ["too short", "noisy"]


def test_a_modelled_cell_is_not_too_short() -> None:
    estimate = median_interval([100.0] * 6)
    assert cell_warnings(estimate, 0.001, measured=False) == []


def test_a_clear_difference_is_significant() -> None:
    ratio = ratio_interval([100.0, 101, 99, 100, 102, 98], [150.0, 151, 149, 150, 152, 148])
    assert ratio is not None
    assert ratio.value == pytest.approx(1.5)
    assert ratio.significant
    assert ratio.describe() == f"1.50x [{ratio.low:.2f}, {ratio.high:.2f}]"


def test_overlapping_rounds_are_not_significant() -> None:
    ratio = ratio_interval([100.0, 140, 60, 120, 80, 100], [110.0, 150, 70, 90, 130, 105])
    assert ratio is not None
    assert ratio.low < 1 < ratio.high
    assert ratio.describe().endswith("not significant")


def cell(mode: str, rounds: list[float]) -> dict[str, object]:
    return {
        "dispatch_mode": mode,
        "rw": "read",
        "bs": 65536,
        "measured_mb_s": sorted(rounds)[len(rounds) // 2],
        "measured_mb_s_rounds": rounds,
    }


def test_the_table_shows_intervals_and_the_ratio_with_its_verdict() -> None:
    cells = [
        cell("bio", [100.0, 140, 60, 120, 80, 100]),
        cell("request", [110.0, 150, 70, 90, 130, 105]),
    ]
    table = report.render_table(report.compare(cells, metric="measured_mb_s"))
    header, _, row = table.splitlines()
    assert "request/bio [95 % CI]" in header
    assert "100 [60.00, 140]" in row
    assert "not significant" in row


def test_cells_without_rounds_keep_the_plain_table() -> None:
    cells = [
        {"dispatch_mode": "bio", "rw": "read", "bs": 4096, "modelled_mb_s": 10.0},
        {"dispatch_mode": "request", "rw": "read", "bs": 4096, "modelled_mb_s": 20.0},
    ]
    header = report.render_table(report.compare(cells)).splitlines()[0]
    assert "CI" not in header
