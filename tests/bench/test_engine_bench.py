"""Engine benchmarks: modelled dd figures next to the published ones, and real software MB/s.

Run with ``pytest -m bench tests/bench/test_engine_bench.py -s``; prints tables.
"""

import dataclasses
import os
import time

import pytest

from app.crypto.keys import KeyMaterial
from app.crypto.spec import parse_cipher_spec
from app.crypto.transform import make_transform
from app.engine.base import EngineRequest
from app.engine.cost import ModelledWorkload, predict_workload
from app.engine.fit import CALIBRATIONS, residuals
from app.engine.model import ModelSpec
from app.engine.presets import DEVICE_MODELS, ENGINES, SOFTWARE
from app.engine.simulated import SimulatedEngine

pytestmark = pytest.mark.bench

KIB = 1024
MIB = 1024 * KIB


def test_dd_512k_bio_vs_request_on_am335x_sdcard():
    engine, device = ENGINES["omap-aes-am335x"], DEVICE_MODELS["sdcard-bbb"]
    stock = dataclasses.replace(
        engine, capabilities=dataclasses.replace(engine.capabilities, bulk_ivmodes=frozenset())
    )
    spec = ModelSpec("aes", "cbc", "plain64")
    published = {("read", "bio"): 5.8, ("read", "request"): 13.0, ("write", "bio"): 4.9,
                 ("write", "request"): 9.2}  # fmt: skip
    print("\ndd bs=512K direct, aes-cbc-plain64, omap-aes-am335x + sdcard-bbb")
    print(f"{'op':6} {'mode':8} {'calls/io':>9} {'modelled MB/s':>14} {'published':>10}")
    for (op, mode), figure in published.items():
        workload = ModelledWorkload(op=op, io_bytes=512 * KIB, count=64, dispatch_mode=mode)
        # Stock bio-based dm-crypt never used bulk; the RFC's request path did.
        profile = stock if mode == "bio" else engine
        result = predict_workload(profile, device, workload, spec)
        print(f"{op:6} {mode:8} {result.calls_per_io:9d} {result.mb_per_s:14.2f} {figure:10.1f}")
        assert abs(result.mb_per_s / figure - 1) <= 0.10
    with_bulk = predict_workload(
        engine, device, ModelledWorkload(op="read", io_bytes=512 * KIB, dispatch_mode="bio"), spec
    )
    print(f"bio mode with the bulk engine (one call per bio): {with_bulk.mb_per_s:.2f} MB/s")
    for name, calibration in sorted(CALIBRATIONS.items()):
        print(f"\ncalibration {name}")
        for row in residuals(calibration, ENGINES[name], DEVICE_MODELS[calibration.device.name]):
            print(
                f"  {row.label:40} {row.published_mb_per_s:8.1f} "
                f"{row.modelled_mb_per_s:8.2f} {row.relative_error:+7.1%}"
            )


def _measure(engine, transform, payload, repeat):
    began = time.perf_counter()
    for index in range(repeat):
        engine.process(EngineRequest("encrypt", transform, [payload], index * len(payload) // 512,
                       dispatch_mode="request"))  # fmt: skip
    return len(payload) * repeat / (time.perf_counter() - began) / 1e6


@pytest.mark.parametrize("text", ["aes-xts-plain64", "aes-cbc-essiv:sha256"])
def test_software_engine_bulk_vs_per_unit(text):
    spec = parse_cipher_spec(text)
    key = KeyMaterial(os.urandom(spec.valid_key_sizes[-1]))
    transform = make_transform(spec, key, impl="auto")
    per_unit_profile = dataclasses.replace(
        SOFTWARE,
        capabilities=dataclasses.replace(SOFTWARE.capabilities, bulk_ivmodes=frozenset()),
    )
    payload = os.urandom(1 * MIB)
    bulk_engine, unit_engine = SimulatedEngine(SOFTWARE), SimulatedEngine(per_unit_profile)
    bulk = _measure(bulk_engine, transform, payload, 16)
    unit = _measure(unit_engine, transform, payload, 4)
    busy_bulk = bulk_engine.snapshot().clock.busy_ns
    busy_unit = unit_engine.snapshot().clock.busy_ns
    print(f"\nsoftware engine, {text}, 1 MiB requests, 512 B units (wall MB/s incl. planning)")
    print(f"  bulk     : {bulk:9.1f} MB/s  (engine busy {16 * MIB / busy_bulk * 1e3:9.1f} MB/s)")
    print(f"  per-unit : {unit:9.1f} MB/s  (engine busy {4 * MIB / busy_unit * 1e3:9.1f} MB/s)")
    assert bulk > unit
