import pytest

from app.engine.cost import (
    ModelledWorkload,
    StageTimes,
    makespan_ns,
    pipeline_time,
    plan_cost,
    predict_workload,
)
from app.engine.model import Capabilities, CostModel, DeviceModel, EngineProfile, ModelSpec
from app.engine.planner import plan_calls
from app.engine.presets import NONE_DEVICE, OMAP_AES_AM335X

COST = CostModel(
    setup_ns=1000.0, segment_ns=100.0, encrypt_bytes_per_s=1e9, decrypt_bytes_per_s=5e8
)


def profile(channels=1, bulk=True, cpu_iv_ns=0.0):
    caps = Capabilities(
        ciphers=None,
        chainmodes=None,
        bulk_ivmodes=frozenset({"plain64"}) if bulk else frozenset(),
        max_bytes_per_call=1 << 20,
        max_segments_per_call=1024,
        channels=channels,
    )
    return EngineProfile(name="t", capabilities=caps, cost=COST, cpu_iv_ns=cpu_iv_ns)


DEVICE = DeviceModel(
    name="d",
    read_latency_ns=10_000.0,
    read_bytes_per_s=1e9,
    write_latency_ns=20_000.0,
    write_bytes_per_s=5e8,
)


def test_call_cost_is_setup_plus_segments_plus_bytes():
    assert COST.call_ns("encrypt", 4096, 2) == pytest.approx(1000 + 200 + 4096)
    assert COST.call_ns("decrypt", 4096, 1) == pytest.approx(1000 + 100 + 8192)


def test_makespan_spreads_calls_over_channels():
    assert makespan_ns([10.0] * 4, 1) == 40
    assert makespan_ns([10.0] * 4, 2) == 20
    assert makespan_ns([30.0, 10.0, 10.0, 10.0], 2) == 30


def test_plan_cost_charges_cpu_ivs_only_on_the_fallback_path():
    segments = [4096]
    fallback = plan_calls(
        profile(bulk=False).capabilities,
        ModelSpec(),
        segments,
        op="encrypt",
        data_unit_size=512,
        dispatch_mode="request",
    )
    cost = plan_cost(profile(bulk=False, cpu_iv_ns=50.0), fallback)
    assert cost.cpu_ns == 8 * 50
    assert cost.engine_busy_ns == pytest.approx(8 * (1000 + 100 + 512))
    assert cost.latency_ns == pytest.approx(cost.cpu_ns + cost.makespan_ns)
    bulk = plan_calls(
        profile().capabilities,
        ModelSpec(),
        segments,
        op="encrypt",
        data_unit_size=512,
        dispatch_mode="request",
    )
    assert plan_cost(profile(cpu_iv_ns=50.0), bulk).cpu_ns == 0


def test_queue_depth_one_is_storage_and_crypto_in_series():
    workload = ModelledWorkload(op="write", io_bytes=8192, count=3, segment_bytes=4096)
    result = predict_workload(profile(), DEVICE, workload)
    storage = 20_000 + 8192 * 2
    crypto = 1000 + 2 * 100 + 8192
    assert result.storage_ns == pytest.approx(storage)
    assert result.crypto_ns == pytest.approx(crypto)
    assert result.total_ns == pytest.approx(3 * (storage + crypto))
    assert result.calls_per_io == 1
    assert result.bulk


def test_deeper_queue_overlaps_crypto_with_storage():
    workload = ModelledWorkload(op="read", io_bytes=8192, count=10, queue_depth=4)
    result = predict_workload(profile(), DEVICE, workload)
    storage = 10_000 + 8192.0
    crypto = 1000 + 2 * 100 + 8192 * 2
    assert result.period_ns == pytest.approx(max(storage, crypto))
    assert result.total_ns == pytest.approx(storage + crypto + 9 * max(storage, crypto))


def test_channels_divide_the_engine_stage_when_the_queue_is_deep():
    workload = ModelledWorkload(op="read", io_bytes=4096, count=100, queue_depth=8)
    instant = DeviceModel(name="none")
    one = predict_workload(profile(channels=1), instant, workload)
    four = predict_workload(profile(channels=4), instant, workload)
    assert four.period_ns == pytest.approx(one.period_ns / 4)


def test_bio_mode_without_bulk_makes_one_call_per_unit():
    workload = ModelledWorkload(op="write", io_bytes=512 * 1024, dispatch_mode="bio")
    result = predict_workload(profile(bulk=False), DEVICE, workload)
    assert result.calls_per_io == 1024
    assert not result.bulk


def test_request_mode_splits_io_above_max_request_bytes():
    workload = ModelledWorkload(op="read", io_bytes=1 << 20, max_request_bytes=256 * 1024)
    result = predict_workload(profile(), DEVICE, workload)
    assert result.calls_per_io == 4
    assert result.storage_ns == pytest.approx(4 * 10_000 + (1 << 20))


def test_raw_device_has_no_crypto():
    workload = ModelledWorkload(op="read", io_bytes=65536, encrypted=False)
    result = predict_workload(profile(), DEVICE, workload)
    assert result.crypto_ns == 0
    assert result.mb_per_s == pytest.approx(65536 / (10_000 + 65536) * 1e3)


def test_queue_depth_bounds_the_channels_that_overlap():
    """Two one-call I/Os in flight keep two of four channels busy, not four."""
    stages = StageTimes(storage_ns=0.0, cpu_ns=0.0, engine_busy_ns=10e3, crypto_ns=10e3, calls=1)
    pipeline = pipeline_time(stages, count=10, queue_depth=2, channels=4)
    assert pipeline.period_ns == pytest.approx(5e3)
    assert pipeline.total_ns == pytest.approx(10e3 + 9 * 5e3)


def test_queue_depth_one_adds_storage_and_crypto():
    stages = StageTimes.mean(
        2, storage_ns=30e6, cpu_ns=1e6, engine_busy_ns=10e6, crypto_ns=11e6, calls=2
    )
    assert pipeline_time(stages, count=2, queue_depth=1, channels=1).total_ns == pytest.approx(41e6)


def test_measured_totals_overlap_at_the_bottleneck_after_the_first_item():
    stages = StageTimes.mean(
        4, storage_ns=8e6, cpu_ns=0.0, engine_busy_ns=100e6, crypto_ns=100e6, calls=4
    )
    pipeline = pipeline_time(stages, count=4, queue_depth=8, channels=2)
    assert pipeline.total_ns == pytest.approx((8e6 + 100e6) / 4 + 3 * 100e6 / 4 / 2)


def test_no_items_is_no_time():
    stages = StageTimes.mean(
        0, storage_ns=0.0, cpu_ns=0.0, engine_busy_ns=0.0, crypto_ns=0.0, calls=0
    )
    assert pipeline_time(stages, count=0, queue_depth=4, channels=1).total_ns == 0.0


def test_a_split_caps_engine_calls_but_never_raises_the_engines_own_limit():
    profile = OMAP_AES_AM335X
    whole = predict_workload(profile, NONE_DEVICE, ModelledWorkload("read", 1 << 20))
    split = predict_workload(
        profile, NONE_DEVICE, ModelledWorkload("read", 1 << 20, split_bytes=128 << 10)
    )
    wider = predict_workload(
        profile, NONE_DEVICE, ModelledWorkload("read", 1 << 20, split_bytes=4 << 20)
    )
    assert (whole.calls_per_io, split.calls_per_io, wider.calls_per_io) == (1, 8, 1)
