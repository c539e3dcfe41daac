import dataclasses

import pytest

from app.engine.model import Capabilities, CostModel, DeviceModel, EngineProfile, ModelSpec
from app.engine.presets import DEVICE_MODELS, ENGINES
from app.errors import InvalidInput

BULK = Capabilities(bulk_ivmodes=frozenset({"plain64", "essiv"}), keyed_iv=True)


@pytest.mark.parametrize("ivmode", ["plain", "plain64", "plain64be", "null", "benbi"])
def test_unkeyed_iv_modes_are_derivable_by_a_bulk_engine(ivmode):
    caps = Capabilities(bulk_ivmodes=frozenset({ivmode}))
    assert caps.derives_iv(ModelSpec(ivmode=ivmode))


@pytest.mark.parametrize("ivmode", ["essiv", "eboiv"])
def test_keyed_iv_modes_need_the_engine_to_hold_the_key(ivmode):
    holding = Capabilities(bulk_ivmodes=frozenset({ivmode}), keyed_iv=True)
    assert holding.derives_iv(ModelSpec(ivmode=ivmode))
    with pytest.raises(InvalidInput, match="keyed_iv"):
        Capabilities(bulk_ivmodes=frozenset({ivmode})).validate()


@pytest.mark.parametrize("ivmode", ["lmk", "tcw", "elephant", "random"])
def test_data_dependent_iv_modes_are_never_bulk(ivmode):
    assert "cannot be derived" in (BULK.fallback_reason(ModelSpec(ivmode=ivmode)) or "")
    with pytest.raises(InvalidInput, match="cannot be derived"):
        Capabilities(bulk_ivmodes=frozenset({ivmode}), keyed_iv=True).validate()


def test_keycount_above_one_is_never_bulk():
    reason = BULK.fallback_reason(ModelSpec(ivmode="plain64", keycount=2))
    assert reason is not None
    assert "different keys" in reason


def test_ecb_is_bulk_only_on_a_bulk_engine():
    assert BULK.derives_iv(ModelSpec(chainmode="ecb", ivmode=None))
    assert not Capabilities().derives_iv(ModelSpec(chainmode="ecb", ivmode=None))


def test_iv_mode_not_listed_falls_back():
    assert BULK.fallback_reason(ModelSpec(ivmode="benbi")) == "engine does not derive IV mode benbi"


def test_unsupported_cipher_mode_and_unit_size_are_explained():
    caps = Capabilities(data_unit_sizes=frozenset({512}))
    assert "cipher" in (caps.unsupported_reason(ModelSpec(cipher="sm4"), 512) or "")
    assert "chain mode" in (caps.unsupported_reason(ModelSpec(chainmode="xts"), 512) or "")
    assert "data unit size" in (caps.unsupported_reason(ModelSpec(), 4096) or "")
    assert caps.unsupported_reason(ModelSpec(), 512) is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"max_bytes_per_call": 256}, "max_bytes_per_call"),
        ({"max_bytes_per_call": 2 << 30}, "max_bytes_per_call"),
        ({"max_bytes_per_call": 1000}, "multiple of 512"),
        ({"max_segments_per_call": 0}, "max_segments_per_call"),
        ({"channels": 0}, "channels"),
        ({"data_unit_sizes": frozenset({768})}, "data_unit_sizes"),
        ({"ciphers": frozenset()}, "ciphers"),
    ],
)
def test_capability_limits_are_validated(change, message):
    with pytest.raises(InvalidInput, match=message):
        dataclasses.replace(Capabilities(), **change).validate()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"setup_ns": -1.0}, "setup_ns"),
        ({"encrypt_bytes_per_s": 0.0}, "encrypt_bytes_per_s"),
        ({"decrypt_bytes_per_s": float("nan")}, "decrypt_bytes_per_s"),
        ({"decrypt_bytes_per_s": 1e15}, "decrypt_bytes_per_s"),
    ],
)
def test_cost_model_rates_must_be_positive_and_sane(change, message):
    base = CostModel(setup_ns=1.0, segment_ns=0.0, encrypt_bytes_per_s=1e6, decrypt_bytes_per_s=1e6)
    with pytest.raises(InvalidInput, match=message):
        dataclasses.replace(base, **change).validate()


def test_device_model_refuses_bad_names_and_rates():
    with pytest.raises(InvalidInput, match="name"):
        DeviceModel(name="Bad Name").validate()
    with pytest.raises(InvalidInput, match="read_bytes_per_s"):
        DeviceModel(name="x", read_bytes_per_s=-5.0).validate()


@pytest.mark.parametrize("profile", list(ENGINES.values()), ids=list(ENGINES))
def test_engine_profiles_round_trip_through_json_dicts(profile):
    assert EngineProfile.from_dict(profile.to_dict()) == profile


@pytest.mark.parametrize("model", list(DEVICE_MODELS.values()), ids=list(DEVICE_MODELS))
def test_device_models_round_trip_through_json_dicts(model):
    assert DeviceModel.from_dict(model.to_dict()) == model


def test_from_dict_names_the_missing_field():
    data = ENGINES["mv-cesa"].to_dict()
    del data["cost"]["setup_ns"]
    with pytest.raises(InvalidInput, match=r"cost\.setup_ns: Field required"):
        EngineProfile.from_dict(data)


def test_from_dict_fills_omitted_fields_with_the_declared_defaults():
    data = {
        "name": "minimal",
        "capabilities": {},
        "cost": {"setup_ns": 1.0, "encrypt_bytes_per_s": 1e6, "decrypt_bytes_per_s": 1e6},
    }
    profile = EngineProfile.from_dict(data)
    assert profile.capabilities == Capabilities()
    assert profile.cost.segment_ns == 0.0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"max_segments_per_call": "8"}, "max_segments_per_call"),
        ({"keyed_iv": 1}, "keyed_iv"),
        ({"ciphers": ["AES"]}, "ciphers"),
        ({"channel": 2}, "channel"),
    ],
)
def test_from_dict_refuses_coercions_bad_names_and_unknown_fields(data, message):
    with pytest.raises(InvalidInput, match=message):
        Capabilities.from_dict(data)


def test_to_dict_lists_sets_sorted():
    data = Capabilities(bulk_ivmodes=frozenset({"plain64", "essiv"}), keyed_iv=True).to_dict()
    assert data["bulk_ivmodes"] == ["essiv", "plain64"]
    assert data["data_unit_sizes"] == [512, 1024, 2048, 4096]


def test_none_device_is_instant():
    none = DEVICE_MODELS["none"]
    assert none.instant
    assert none.io_ns("write", 1 << 20) == 0


def test_device_io_time_is_latency_plus_transfer():
    model = DeviceModel(name="d", read_latency_ns=1000.0, read_bytes_per_s=1e9)
    assert model.io_ns("read", 4096) == pytest.approx(1000 + 4096)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"write_buffer_bytes": 1 << 20}, "go together"),
        ({"write_sustained_bytes_per_s": 1e6}, "go together"),
        (
            {
                "write_bytes_per_s": 1e6,
                "write_buffer_bytes": 1 << 20,
                "write_sustained_bytes_per_s": 2e6,
            },
            "exceeds write_bytes_per_s",
        ),
    ],
)
def test_write_buffer_needs_its_sustained_rate_below_the_burst(fields, message):
    with pytest.raises(InvalidInput, match=message):
        DeviceModel.from_dict({"name": "card", **fields})


def test_write_past_the_buffer_takes_the_sustained_rate():
    model = DeviceModel(
        name="card",
        write_latency_ns=100.0,
        write_bytes_per_s=1e9,
        write_buffer_bytes=4096,
        write_sustained_bytes_per_s=5e8,
    )
    assert model.write_ns(4096, 1024) == pytest.approx(100 + 1024 + 3072 * 2)
    assert model.stream_burst_share(16384) == 0.25
    assert not model.instant
