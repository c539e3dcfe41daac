import dataclasses
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.crypto.keys import KeyMaterial
from app.crypto.spec import parse_cipher_spec
from app.crypto.transform import make_transform
from app.engine.base import EngineRequest
from app.engine.model import DERIVABLE_IV_MODES, Capabilities
from app.engine.presets import ENGINES, MV_CESA, OMAP_AES_AM335X, SOFTWARE
from app.engine.registry import EngineRegistry
from app.engine.simulated import SimulatedEngine
from app.errors import AlreadyExists, EngineNotFound, InvalidInput

pytestmark = pytest.mark.usefixtures("engine_model")

SPECS = [
    "aes-xts-plain64",
    "aes-cbc-essiv:sha256",
    "aes-cbc-plain",
    "aes-cbc-plain64be",
    "aes-cbc-benbi",
    "aes-cbc-null",
    "aes-cbc-eboiv",
    "aes-ecb",
    "aes-ctr-plain64",
    "aes:2-cbc-plain64",
    "aes-cbc-lmk",
    "aes-cbc-tcw",
]


def transform_for(text, unit, impl="auto"):
    spec = parse_cipher_spec(text)
    key = KeyMaterial(os.urandom(spec.valid_key_sizes[-1]))
    ivmode_ok = spec.ivmode not in ("lmk", "tcw") or unit == 512
    sector_size = unit if ivmode_ok else 512
    return spec, key, make_transform(spec, key, sector_size=sector_size, impl=impl)


@st.composite
def requests(draw):
    text = draw(st.sampled_from(SPECS))
    unit = draw(st.sampled_from([512, 1024, 4096]))
    if "lmk" in text or "tcw" in text:
        unit = 512
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=5))
    segments = [os.urandom(n * unit) for n in sizes]
    sector = draw(st.integers(0, 1 << 20)) * (unit // 512)
    caps = Capabilities(
        ciphers=None,
        chainmodes=None,
        bulk_ivmodes=DERIVABLE_IV_MODES,
        keyed_iv=True,
        max_bytes_per_call=draw(st.integers(unit // 512, 24)) * 512,
        max_segments_per_call=draw(st.integers(1, 4)),
        channels=draw(st.integers(1, 3)),
    )
    measured = draw(st.booleans())
    mode = draw(st.sampled_from(["bio", "request"]))
    return text, unit, segments, sector, caps, measured, mode


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_engine_output_is_byte_identical_to_the_per_unit_reference(request):
    text, unit, segments, sector, caps, measured, mode = request
    spec, key, transform = transform_for(text, unit)
    reference = make_transform(spec, key, sector_size=transform.sector_size, impl="reference")
    profile = dataclasses.replace(SOFTWARE, capabilities=caps, measured=measured)
    engine = SimulatedEngine(profile)
    bios = None
    if mode == "bio" and len(segments) > 1:
        first = len(segments[0]) // 512
        total = sum(len(s) for s in segments) // 512
        bios = [(sector, first), (sector + first, total - first)]
    result = engine.process(
        EngineRequest("encrypt", transform, segments, sector, dispatch_mode=mode, bios=bios)
    )
    expected = reference.encrypt(b"".join(segments), sector)
    assert b"".join(result.outputs) == expected
    assert [len(o) for o in result.outputs] == [len(s) for s in segments]
    back = engine.process(
        EngineRequest("decrypt", transform, result.outputs, sector, dispatch_mode=mode, bios=bios)
    )
    assert b"".join(back.outputs) == b"".join(segments)


def test_software_engine_measures_every_planned_call():
    _, _, transform = transform_for("aes-cbc-essiv:sha256", 512)
    engine = SimulatedEngine(SOFTWARE)
    result = engine.process(
        EngineRequest("encrypt", transform, [bytes(8192)], 0, dispatch_mode="request")
    )
    assert result.plan.bulk
    assert result.calls == 1
    assert result.modelled_ns > 0
    cesa_like = dataclasses.replace(
        SOFTWARE, capabilities=dataclasses.replace(SOFTWARE.capabilities, bulk_ivmodes=frozenset())
    )
    per_unit = SimulatedEngine(cesa_like).process(
        EngineRequest("encrypt", transform, [bytes(8192)], 0, dispatch_mode="request")
    )
    assert per_unit.calls == 16
    assert per_unit.outputs == result.outputs


def test_hardware_engine_models_calls_and_cpu_ivs():
    _, _, transform = transform_for("aes-cbc-essiv:sha256", 512)
    engine = SimulatedEngine(MV_CESA)
    result = engine.process(
        EngineRequest("encrypt", transform, [bytes(4096)], 0, dispatch_mode="request")
    )
    per_call = MV_CESA.cost.call_ns("encrypt", 512, 1)
    assert result.calls == 8
    assert result.cpu_ns == round(8 * MV_CESA.cpu_iv_ns)
    assert result.modelled_ns == round(8 * per_call + 8 * MV_CESA.cpu_iv_ns)


def test_bio_mode_on_a_bulk_engine_is_one_call_per_bio():
    _, _, transform = transform_for("aes-cbc-plain64", 512)
    engine = SimulatedEngine(OMAP_AES_AM335X)
    result = engine.process(
        EngineRequest(
            "encrypt",
            transform,
            [bytes(4096), bytes(4096)],
            8,
            dispatch_mode="bio",
            bios=[(8, 8), (16, 8)],
        )
    )
    assert result.plan.bulk_calls == 2


def test_snapshot_counts_calls_bytes_and_busy_time():
    _, _, transform = transform_for("aes-cbc-essiv:sha256", 512)
    engine = SimulatedEngine(MV_CESA)
    engine.process(EngineRequest("encrypt", transform, [bytes(1024)], 0, dispatch_mode="bio"))
    engine.process(EngineRequest("decrypt", transform, [bytes(512)], 0, dispatch_mode="bio"))
    stats = engine.snapshot()
    assert (stats.requests, stats.unit_calls, stats.bulk_calls) == (2, 3, 0)
    assert (stats.bytes_encrypted, stats.bytes_decrypted) == (1024, 512)
    assert stats.clock.busy_ns > 0
    assert "utilization_virtual" in stats.to_dict()


def test_engine_refuses_a_spec_it_cannot_run():
    _, _, transform = transform_for("aes-xts-plain64", 512)
    engine = SimulatedEngine(MV_CESA)
    with pytest.raises(InvalidInput, match="chain mode xts"):
        engine.process(
            EngineRequest("encrypt", transform, [bytes(512)], 0, dispatch_mode="request")
        )
    with pytest.raises(InvalidInput, match="mv-cesa"):
        engine.check(transform.spec, 512)


def test_pacing_really_sleeps_at_least_the_scaled_modelled_time():
    _, _, transform = transform_for("aes-cbc-essiv:sha256", 512)
    engine = SimulatedEngine(MV_CESA, pacing=0.01)
    before = engine.clock.now_ns()
    result = engine.process(
        EngineRequest("encrypt", transform, [bytes(4096)], 0, dispatch_mode="request")
    )
    assert engine.clock.now_ns() - before >= result.modelled_ns


def test_registry_serves_one_live_engine_per_profile():
    registry = EngineRegistry()
    assert registry.engine("mv-cesa") is registry.engine("mv-cesa")
    assert registry.device_timer("sdcard-bbb") is registry.device_timer("sdcard-bbb")
    assert {p.name for p in registry.profiles()} == set(ENGINES)
    with pytest.raises(EngineNotFound):
        registry.engine("nope")


class MemoryStore:
    def __init__(self):
        self.engines = []
        self.devices = []

    def load_engines(self):
        return list(self.engines)

    def load_device_models(self):
        return list(self.devices)

    def save_engine(self, data):
        self.engines.append(dict(data))

    def save_device_model(self, data):
        self.devices.append(dict(data))


def test_registry_persists_and_reloads_custom_engines():
    store = MemoryStore()
    custom = dataclasses.replace(MV_CESA, name="my-cesa")
    registry = EngineRegistry(store)
    registry.add_profile(custom)
    with pytest.raises(AlreadyExists):
        registry.add_profile(custom)
    reloaded = EngineRegistry(store)
    reloaded.load()
    assert reloaded.profile("my-cesa") == custom


def test_registry_refuses_custom_measured_engines():
    with pytest.raises(InvalidInput, match="measured"):
        EngineRegistry().add_profile(dataclasses.replace(SOFTWARE, name="fake-software"))
