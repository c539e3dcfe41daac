import pytest

from app.engine.fit import CALIBRATIONS, PARAMETERS, fit, render_markdown, residuals
from app.engine.presets import DEVICE_MODELS, ENGINES

TOLERANCE = 0.10


@pytest.mark.parametrize("name", sorted(CALIBRATIONS))
def test_fit_reproduces_every_calibration_figure_within_ten_percent(name):
    result = fit(CALIBRATIONS[name])
    for row in result.residuals:
        assert abs(row.relative_error) <= TOLERANCE, row


@pytest.mark.parametrize("name", sorted(CALIBRATIONS))
def test_shipped_presets_reproduce_every_calibration_figure(name):
    calibration = CALIBRATIONS[name]
    engine = ENGINES[name]
    device = DEVICE_MODELS[calibration.device.name]
    for row in residuals(calibration, engine, device):
        assert abs(row.relative_error) <= TOLERANCE, row


@pytest.mark.parametrize("name", sorted(CALIBRATIONS))
def test_shipped_presets_are_the_fitted_parameters(name):
    calibration = CALIBRATIONS[name]
    result = fit(calibration)
    engine, device = ENGINES[name], DEVICE_MODELS[calibration.device.name]
    assert engine.cost.setup_ns == pytest.approx(result.engine.cost.setup_ns, rel=1e-3)
    assert engine.cost.encrypt_bytes_per_s == pytest.approx(
        result.engine.cost.encrypt_bytes_per_s, rel=1e-3
    )
    assert engine.cost.decrypt_bytes_per_s == pytest.approx(
        result.engine.cost.decrypt_bytes_per_s, rel=1e-3
    )
    assert engine.cpu_iv_ns == result.engine.cpu_iv_ns
    assert engine.capabilities == result.engine.capabilities
    for field in ("read_latency_ns", "write_latency_ns"):
        assert getattr(device, field) == pytest.approx(getattr(result.device, field), rel=1e-3)
    for field in ("read_bytes_per_s", "write_bytes_per_s"):
        assert getattr(device, field) == pytest.approx(getattr(result.device, field), rel=1e-3)


def test_bio_based_figures_are_slower_than_request_based():
    by_label = {
        r.label: r.modelled_mb_per_s for r in fit(CALIBRATIONS["omap-aes-am335x"]).residuals
    }
    assert by_label["bio-based read, dd 512 KiB"] < by_label["request-based read, dd 512 KiB"]
    assert by_label["bio-based write, dd 512 KiB"] < by_label["request-based write, dd 512 KiB"]


def test_markdown_report_lists_every_parameter():
    text = render_markdown()
    for parameter in PARAMETERS:
        assert parameter in text
