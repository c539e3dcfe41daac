import pytest

from app.engine import accel
from app.engine.model import Capabilities, ModelSpec
from app.engine.planner import _bulk_calls
from app.errors import InvalidInput
from tests.unit.engine.conftest import planner_of

pytestmark = pytest.mark.usefixtures("engine_model")

BULK = Capabilities(
    ciphers=None,
    chainmodes=None,
    bulk_ivmodes=frozenset({"plain64"}),
    max_bytes_per_call=64 * 1024,
    max_segments_per_call=4,
)
PLAIN64 = ModelSpec(ivmode="plain64")
ESSIV = ModelSpec(ivmode="essiv")
PAGE = 4096


def plan(spec, segments, *, mode="request", caps=BULK, unit=512, sector=0, bios=None):
    return planner_of("python" if accel.reference else "c")(
        caps,
        spec,
        segments,
        op="encrypt",
        data_unit_size=unit,
        dispatch_mode=mode,
        sector=sector,
        bios=bios,
    )


def test_derivable_request_is_one_bulk_call_within_limits():
    result = plan(PLAIN64, [PAGE] * 4)
    assert result.bulk
    assert [(c.offset, c.nbytes, c.nr_segments, c.bulk) for c in result.calls] == [
        (0, 4 * PAGE, 4, True)
    ]
    assert result.cpu_iv_units == 0


def test_bulk_calls_are_chunked_by_max_segments():
    result = plan(PLAIN64, [PAGE] * 10)
    assert [c.nr_segments for c in result.calls] == [4, 4, 2]
    assert [c.sector for c in result.calls] == [0, 32, 64]


def test_bulk_calls_are_chunked_by_max_bytes():
    result = plan(PLAIN64, [128 * 1024])
    assert [c.nbytes for c in result.calls] == [64 * 1024, 64 * 1024]
    assert [c.nr_units for c in result.calls] == [128, 128]


def test_chunks_cut_on_data_unit_boundaries_inside_a_segment():
    caps = Capabilities(bulk_ivmodes=frozenset({"plain64"}), max_bytes_per_call=6144)
    result = plan(PLAIN64, [16384], caps=caps, unit=4096)
    assert [c.nbytes for c in result.calls] == [4096, 4096, 4096, 4096]


def test_a_unit_over_more_segments_than_allowed_still_goes_alone():
    caps = Capabilities(bulk_ivmodes=frozenset({"plain64"}), max_segments_per_call=1)
    result = plan(PLAIN64, [1024, 1024, 2048], caps=caps, unit=2048)
    assert [(c.nbytes, c.nr_segments) for c in result.calls] == [(2048, 2), (2048, 1)]


def test_non_derivable_iv_mode_falls_back_to_one_call_per_unit():
    result = plan(ESSIV, [PAGE, PAGE])
    assert not result.bulk
    assert result.unit_calls == 16
    assert result.cpu_iv_units == 16
    assert all(c.nbytes == 512 and not c.bulk for c in result.calls)
    assert [c.sector for c in result.calls] == list(range(16))
    assert "essiv" in (result.fallback_reason or "")


def test_keycount_two_falls_back_even_when_the_mode_is_derivable():
    result = plan(ModelSpec(ivmode="plain64", keycount=2), [PAGE])
    assert result.unit_calls == 8


def test_unit_call_sectors_step_by_data_unit_size():
    result = plan(ESSIV, [8192], unit=4096, sector=16)
    assert [c.sector for c in result.calls] == [16, 24]


def test_bio_mode_bulk_engine_makes_one_call_per_bio():
    result = plan(PLAIN64, [PAGE, PAGE, PAGE], mode="bio", sector=8, bios=[(8, 8), (16, 16)])
    assert [(c.offset, c.nbytes, c.sector) for c in result.calls] == [
        (0, PAGE, 8),
        (PAGE, 2 * PAGE, 16),
    ]


def test_bio_mode_without_bios_treats_the_request_as_one_bio():
    assert len(plan(PLAIN64, [PAGE] * 3, mode="bio").calls) == 1


def test_bio_mode_without_derivation_is_one_call_per_unit():
    result = plan(ESSIV, [PAGE], mode="bio", bios=[(0, 8)])
    assert result.unit_calls == 8


def test_request_mode_ignores_bio_boundaries():
    assert len(plan(PLAIN64, [PAGE] * 2, bios=[(0, 8), (8, 8)]).calls) == 1


@pytest.mark.parametrize(
    ("segments", "kwargs", "message"),
    [
        ([], {}, "at least one segment"),
        ([1000], {}, "whole number"),
        ([4096], {"unit": 4096, "sector": 1}, "aligned"),
        ([4096], {"mode": "bio", "bios": [(0, 4)]}, "cover"),
        ([4096], {"mode": "bio", "bios": [(1, 8)]}, "contiguous"),
    ],
)
def test_bad_geometry_is_refused(segments, kwargs, message):
    with pytest.raises(InvalidInput, match=message):
        plan(PLAIN64, segments, **kwargs)


def test_unsupported_spec_is_refused():
    caps = Capabilities(ciphers=frozenset({"aes"}))
    with pytest.raises(InvalidInput, match="cipher sm4"):
        plan(ModelSpec(cipher="sm4"), [512], caps=caps)


@pytest.mark.parametrize("mode", ["request", "bio"])
@pytest.mark.parametrize("size", [512, PAGE, 64 * 1024, 64 * 1024 + 512])
def test_a_lone_segment_is_planned_as_the_general_chunking_plans_it(mode, size):
    sector = 24
    result = plan(PLAIN64, [size], mode=mode, sector=sector, bios=[(sector, size // 512)])
    expected = _bulk_calls(BULK, [size], 0, size, sector, 512)
    assert result.calls == tuple(expected)
    assert result.nbytes == size


def test_a_lone_segment_in_bio_mode_still_checks_its_bio():
    with pytest.raises(InvalidInput):
        plan(PLAIN64, [PAGE], mode="bio", sector=8, bios=[(0, 8)])
