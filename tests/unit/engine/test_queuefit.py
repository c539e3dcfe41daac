"""The hop cost is fitted on one stock figure per machine; the rest are predictions."""

from __future__ import annotations

import dataclasses

import pytest

from app.engine import queuefit
from app.engine.presets import DEVICE_MODELS, ENGINES
from app.engine.queuefit import QUEUE_CALIBRATIONS, fit_hop, predict

NAMES = sorted(QUEUE_CALIBRATIONS)


@pytest.mark.parametrize("name", NAMES)
def test_the_fit_reproduces_its_one_stock_figure(name: str) -> None:
    result = predict(QUEUE_CALIBRATIONS[name])
    assert result.fitted.relative_error == pytest.approx(0.0, abs=1e-9)
    assert result.fitted.figure.config == "stock"


@pytest.mark.parametrize("name", NAMES)
def test_held_out_figures_never_reach_the_fitted_hop(name: str) -> None:
    calibration = QUEUE_CALIBRATIONS[name]
    scrambled = tuple(
        dataclasses.replace(figure, bytes_per_s=figure.bytes_per_s * 7.5)
        for figure in calibration.held_out
    )
    perturbed = dataclasses.replace(calibration, held_out=scrambled)
    assert predict(perturbed).platform.hop_ns == predict(calibration).platform.hop_ns


@pytest.mark.parametrize("name", NAMES)
def test_the_fit_follows_its_listed_inputs(name: str) -> None:
    calibration = QUEUE_CALIBRATIONS[name]
    hop = fit_hop(calibration.platform, calibration.fit_on).hop_ns
    slower = dataclasses.replace(
        calibration.fit_on, bytes_per_s=calibration.fit_on.bytes_per_s * 0.9
    )
    assert fit_hop(calibration.platform, slower).hop_ns > hop
    faster_device = dataclasses.replace(
        calibration.platform,
        io_ns={op: ns * 0.5 for op, ns in calibration.platform.io_ns.items()},
    )
    assert fit_hop(faster_device, calibration.fit_on).hop_ns > hop


def test_fit_inputs_are_the_platform_and_the_stock_figure_only() -> None:
    assert list(fit_hop.__annotations__) == ["platform", "fit_on", "return"]


def test_fitted_hops_as_documented() -> None:
    hops = {name: predict(c).platform.hop_ns for name, c in QUEUE_CALIBRATIONS.items()}
    assert hops["rfc"] == pytest.approx(15_240, rel=1e-3)
    assert hops["blog"] == pytest.approx(3_770, rel=1e-3)


def test_required_held_out_figures_within_twenty_percent_but_the_blogs_inline() -> None:
    """The inline miss is explained in docs/engines.md: per-bio and per-unit work the
    stock figure cannot separate from the hops."""
    errors = {
        (name, p.figure.config): p.relative_error
        for name, c in QUEUE_CALIBRATIONS.items()
        if c.required
        for p in predict(c).predictions
    }
    inline = ("blog", "inline (xtsproxy, both workqueues off)")
    assert errors.pop(inline) > 0.2
    assert all(abs(error) <= 0.2 for error in errors.values()), errors


def test_the_report_shows_every_figure_with_its_error() -> None:
    markdown = queuefit.render_markdown()
    for calibration in QUEUE_CALIBRATIONS.values():
        for figure in (calibration.fit_on, *calibration.held_out):
            assert figure.shown in markdown
    assert "+67.0%" in markdown


def test_the_blogs_presets_are_its_fitted_platform() -> None:
    platform = predict(QUEUE_CALIBRATIONS["blog"]).platform
    engine, device = ENGINES["aesni-g9"], DEVICE_MODELS["brd-g9"]
    assert engine.queue_hop_ns == pytest.approx(platform.hop_ns, rel=1e-3)
    assert engine.cost.encrypt_bytes_per_s == platform.encrypt_bytes_per_s
    assert engine.cost.decrypt_bytes_per_s == platform.decrypt_bytes_per_s
    assert engine.cost.setup_ns == platform.unit_ns
    assert device.io_ns("read", 4096) == pytest.approx(platform.io_ns["read"], rel=1e-3)
    assert device.io_ns("write", 4096) == pytest.approx(platform.io_ns["write"], rel=1e-3)
    assert device.read_bytes_per_s == platform.device_bytes_per_s


def test_engines_not_fitted_on_queue_figures_model_no_hops() -> None:
    for name in ("software", "omap-aes-am335x", "mv-cesa"):
        assert ENGINES[name].queue_hop_ns == 0.0
