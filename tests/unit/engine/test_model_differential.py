"""The C engine model (``app.engine._model``) against the Python reference on seeded random
traces: every plan, reservation, error and statistic must be the same, field by field."""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest

from app.engine import _model, accel
from app.engine.base import EngineRequest
from app.engine.clock import DeviceTimer, LaneHeap, Reservation, VirtualClock
from app.engine.model import (
    DERIVABLE_IV_MODES,
    KEYED_IV_MODES,
    NEVER_BULK_IV_MODES,
    Capabilities,
    CostModel,
    EngineProfile,
    ModelSpec,
)
from app.engine.planner import CallPlan, EngineCall, plan_calls
from app.engine.presets import DEVICE_MODELS, ENGINES
from app.engine.simulated import EngineCounters, SimulatedEngine
from app.errors import InvalidInput
from app.vocab import SECTOR_SIZE

UNITS = [512, 1024, 2048, 4096]
IV_MODES = [*sorted(DERIVABLE_IV_MODES | NEVER_BULK_IV_MODES), None, "unknown"]


def random_capabilities(rng: random.Random) -> Capabilities:
    if rng.random() < 0.3:
        return rng.choice(list(ENGINES.values())).capabilities
    derivable = sorted(DERIVABLE_IV_MODES)
    bulk = frozenset(rng.sample(derivable, rng.randint(0, len(derivable))))
    keyed = bool(bulk & KEYED_IV_MODES) or rng.random() < 0.5
    return Capabilities(
        ciphers=rng.choice([None, frozenset({"aes"}), frozenset({"aes", "twofish"})]),
        chainmodes=rng.choice([None, frozenset({"cbc", "ecb"}), frozenset({"xts"})]),
        bulk_ivmodes=bulk,
        keyed_iv=keyed,
        data_unit_sizes=frozenset(rng.sample(UNITS, rng.randint(1, 4))),
        max_bytes_per_call=rng.choice([1, 2, 3, 8, 9, 64, 128, 2048]) * SECTOR_SIZE,
        max_segments_per_call=rng.choice([1, 2, 3, 4, 16, 256]),
        channels=rng.choice([1, 1, 2, 3, 8]),
    )


def random_spec(rng: random.Random) -> ModelSpec:
    return ModelSpec(
        cipher=rng.choice(["aes", "aes", "aes", "twofish", "sm4"]),
        chainmode=rng.choice(["cbc", "cbc", "xts", "ecb", "ctr"]),
        ivmode=rng.choice(IV_MODES),
        keycount=rng.choice([1, 1, 1, 2, 64]),
    )


def random_request(rng: random.Random) -> dict[str, Any]:
    """Mostly valid geometry; about one in ten requests breaks one rule."""
    unit = rng.choice(UNITS)
    sizes = [rng.randint(1, 8) * rng.choice([SECTOR_SIZE, unit]) for _ in range(rng.randint(1, 9))]
    if rng.random() < 0.6:
        sizes = [rng.choice([4096, 8192, unit, 64 * 1024])] * rng.randint(1, 3)
    total = sum(sizes)
    if total % unit:
        sizes[-1] += unit - total % unit
    step = unit // SECTOR_SIZE
    sector = rng.randint(0, 1 << 24) * step
    mode = rng.choice(["request", "bio", "bio"])
    bios: list[tuple[int, int]] | None = None
    if rng.random() < 0.7:
        nr_sectors = sum(sizes) // SECTOR_SIZE
        cuts = sorted(rng.sample(range(step, nr_sectors, step), min(3, nr_sectors // step - 1)))
        edges = [0, *cuts, nr_sectors]
        bios = [(sector + low, high - low) for low, high in itertools.pairwise(edges)]
    breakage = rng.random()
    if breakage < 0.02:
        sizes = []
    elif breakage < 0.04:
        sizes[rng.randrange(len(sizes))] = rng.choice([0, -512])
    elif breakage < 0.06:
        sizes[-1] += rng.choice([1, 100, 511])
    elif breakage < 0.08:
        sector += rng.choice([1, -step * (sector // step + 1)])
    elif breakage < 0.10 and bios:
        low, count = bios[-1]
        bios[-1] = rng.choice([(low + 1, count), (low, count + 1), (low, 0), (low, count + step)])
    return {
        "segments": sizes,
        "data_unit_size": rng.choice([*UNITS, unit, unit, unit]) if breakage < 0.12 else unit,
        "sector": sector,
        "dispatch_mode": mode,
        "bios": bios,
        "op": rng.choice(["encrypt", "decrypt"]),
    }


def outcome(planner: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The plan, or the error's type and message."""
    try:
        return planner(*args, **kwargs)
    except Exception as error:  # an error is an outcome to compare
        return (type(error), str(error))


@pytest.mark.parametrize("seed", range(4))
def test_plans_are_the_same_call_for_call_on_random_requests(seed: int) -> None:
    rng = random.Random(seed)
    kinds: dict[str, int] = {"bulk": 0, "unit": 0, "refused": 0}
    for _ in range(2000):
        capabilities, spec = random_capabilities(rng), random_spec(rng)
        request = random_request(rng)
        reference = outcome(plan_calls, capabilities, spec, **request)
        native = outcome(_model.plan_calls, capabilities, spec, **request)
        assert native == reference, (capabilities, spec, request)
        if isinstance(reference, tuple):
            kinds["refused"] += 1
        else:
            kinds["bulk" if reference.bulk else "unit"] += 1
            assert type(native.calls) is tuple
            assert all(
                type(a) is type(b) and dataclasses.astuple(a) == dataclasses.astuple(b)
                for a, b in zip(native.calls, reference.calls, strict=True)
            )
    # The corpus reaches every branch: bulk plans, per-unit plans and refusals.
    assert min(kinds.values()) > 100, kinds


@pytest.mark.parametrize("seed", range(2))
def test_plans_are_the_same_with_segments_positional_as_the_engine_calls_it(seed: int) -> None:
    """The C planner reads its usual call shape (three positional arguments, known keywords)
    without the generic argument parser; the plans and errors stay the reference's."""
    rng = random.Random(100 + seed)
    for _ in range(1000):
        capabilities, spec = random_capabilities(rng), random_spec(rng)
        request = random_request(rng)
        segments = request.pop("segments")
        for dropped in (None, "sector", "bios"):
            kwargs = {key: value for key, value in request.items() if key != dropped}
            reference = outcome(plan_calls, capabilities, spec, segments, **kwargs)
            native = outcome(_model.plan_calls, capabilities, spec, segments, **kwargs)
            assert native == reference, (capabilities, spec, segments, kwargs)


def test_the_c_planner_refuses_the_argument_shapes_python_refuses() -> None:
    capabilities, spec = (
        Capabilities(bulk_ivmodes=frozenset({"plain64"})),
        ModelSpec(ivmode="plain64"),
    )
    good = {"op": "encrypt", "data_unit_size": 512, "dispatch_mode": "request"}
    with pytest.raises(TypeError):
        _model.plan_calls(capabilities, spec, [512], **good, colour="blue")
    with pytest.raises(TypeError):
        _model.plan_calls(capabilities, spec, [512], "encrypt", 512, "request")
    with pytest.raises(TypeError):
        _model.plan_calls(capabilities, spec, [512], op="encrypt", data_unit_size=512)
    keyworded = _model.plan_calls(capabilities, spec, segments=[512], **good)
    assert keyworded == _model.plan_calls(capabilities, spec, [512], **good)


def test_a_plan_follows_new_capabilities_and_specs_not_a_stale_decision() -> None:
    spec = ModelSpec(ivmode="plain64")
    plans = []
    for index in range(20):  # more pairs than the C module remembers decisions for
        capabilities = Capabilities(
            bulk_ivmodes=frozenset({"plain64"}) if index % 2 else frozenset(),
            max_bytes_per_call=(index + 1) * SECTOR_SIZE,
        )
        for implementation in (plan_calls, _model.plan_calls):
            plans.append(
                implementation(
                    capabilities,
                    spec,
                    [8192],
                    op="encrypt",
                    data_unit_size=512,
                    dispatch_mode="request",
                )
            )
    assert plans[0::2] == plans[1::2]
    assert {plan.bulk for plan in plans} == {True, False}
    assert len({len(plan.calls) for plan in plans if plan.bulk}) == 5  # 16 units, 2..20 a call


def random_durations(rng: random.Random) -> list[Any]:
    kind = rng.random()
    count = rng.choice([0, 1, 1, 1, 2, 3, 5, 20])
    if kind < 0.2:
        return [rng.randint(0, 10**7) for _ in range(count)]
    if kind < 0.3:
        return [rng.choice([0.5, 1.5, 2.5, 1e-3, 1e15 + 0.5]) for _ in range(count)]
    return [rng.uniform(0, 1e6) * rng.choice([1, 1e-3, 1e3]) for _ in range(count)]


@pytest.mark.parametrize("seed", range(6))
def test_reservations_and_totals_are_the_same_on_random_traces(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(40):
        lanes = rng.choice([1, 1, 2, 3, 4, 7])
        reference, native = LaneHeap(lanes), _model.Lanes(lanes, Reservation)
        ready = 0
        for _ in range(150):
            ready = max(0, ready + rng.randint(-(10**6), 2 * 10**6))
            durations = random_durations(rng)
            expected = reference.reserve(durations, ready)
            got = native.reserve(tuple(durations) if rng.random() < 0.5 else durations, ready)
            assert type(got) is Reservation
            assert dataclasses.astuple(got) == dataclasses.astuple(expected), (lanes, durations)
            assert native.totals() == reference.totals()


def test_rounding_is_half_to_even_as_python_rounds() -> None:
    for lanes in (1, 2):
        reference, native = LaneHeap(lanes), _model.Lanes(lanes, Reservation)
        for durations in ([0.5], [1.0], [0.5, 0.5, 0.5], [2.5], [3.5, 1e-9], [2**53 + 1.0]):
            assert native.reserve(durations, 0) == reference.reserve(durations, 0)


def test_the_c_model_builds_only_classes_with_a_slot_of_their_own_per_field() -> None:
    """It stores each field in its slot directly: a class without those slots is refused
    when bound, not written past."""

    @dataclasses.dataclass(frozen=True)
    class Unslotted:
        ready_ns: int
        start_ns: int
        end_ns: int
        busy_ns: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Partial:
        ready_ns: int

    for unfit in (Unslotted, Partial):
        with pytest.raises(TypeError, match="slot"):
            _model.Lanes(1, unfit)
        with pytest.raises(TypeError, match="slot"):
            _model.bind_plan(unfit, CallPlan, InvalidInput)
    capabilities = Capabilities(bulk_ivmodes=frozenset({"plain64"}))
    plan = _model.plan_calls(
        capabilities,
        ModelSpec(ivmode="plain64"),
        [4096],
        op="encrypt",
        data_unit_size=512,
        dispatch_mode="request",
    )
    assert type(plan) is CallPlan  # still bound to the planner's own classes
    assert [type(call) for call in plan.calls] == [EngineCall]


class FakeTime:
    def __init__(self) -> None:
        self.now = 0

    def monotonic_ns(self) -> int:
        return self.now


@contextmanager
def selected(reference: bool) -> Iterator[None]:
    before = accel.reference
    accel.use_reference(reference)
    try:
        yield
    finally:
        accel.use_reference(before)


def modelled_profiles() -> list[EngineProfile]:
    """The modelled presets, plus a multi-channel engine for the lane heap."""
    profiles = [profile for profile in ENGINES.values() if not profile.measured]
    wide = dataclasses.replace(
        profiles[0],
        name="wide",
        capabilities=dataclasses.replace(profiles[0].capabilities, channels=4),
        cost=CostModel(setup_ns=1000.5, encrypt_bytes_per_s=3e8, decrypt_bytes_per_s=7e8),
        cpu_iv_ns=33.3,
    )
    return [*profiles, wide]


class FakeTransform:
    """Bytes are not the C model's business: the engine only needs the spec and the unit."""

    def __init__(self, spec: ModelSpec, unit: int) -> None:
        self.spec, self.sector_size = spec, unit

    def encrypt_into(self, data: Any, sector: int, out: Any) -> None:
        memoryview(out)[:] = data

    decrypt_into = encrypt_into


@pytest.mark.parametrize("profile", modelled_profiles(), ids=lambda profile: profile.name)
def test_an_engine_decides_and_counts_the_same_with_either_model(profile: EngineProfile) -> None:
    rng = random.Random(profile.name)
    runs = []
    for reference in (False, True):
        rng = random.Random(profile.name)
        fake = FakeTime()
        results: list[Any] = []
        with selected(reference):
            clock = VirtualClock(profile.capabilities.channels, monotonic_ns=fake.monotonic_ns)
            engine = SimulatedEngine(profile, clock=clock)
            for _ in range(1500):
                fake.now += rng.randint(0, 200_000)
                request = random_request(rng)
                ivmode = rng.choice(["plain64", "essiv", "lmk", None])
                transform = FakeTransform(ModelSpec(ivmode=ivmode), request["data_unit_size"])
                segments = [bytes(max(size, 0)) for size in request["segments"]]
                try:
                    done = engine.process(
                        EngineRequest(
                            request["op"],
                            transform,
                            segments,
                            request["sector"],
                            request["dispatch_mode"],
                            bios=request["bios"],
                        )
                    )
                except Exception as error:  # an error is an outcome to compare
                    results.append((type(error), str(error)))
                    continue
                results.append(
                    (
                        done.plan,
                        done.modelled_ns,
                        done.cpu_ns,
                        done.queue_wait_ns,
                        done.completes_at_ns,
                    )
                )
        runs.append((results, engine.snapshot()))
    (native, native_stats), (reference_results, reference_stats) = runs
    assert native == reference_results
    assert native_stats == reference_stats
    assert native_stats.requests > 500


@pytest.mark.parametrize("model", DEVICE_MODELS.values(), ids=lambda model: model.name)
def test_a_device_timer_charges_the_same_with_either_model(model: Any) -> None:
    snapshots = []
    for reference in (False, True):
        rng = random.Random(model.name)
        fake = FakeTime()
        with selected(reference):
            timer = DeviceTimer(model, clock=VirtualClock(1, monotonic_ns=fake.monotonic_ns))
        charged = []
        for _ in range(2000):
            fake.now += rng.randint(0, 5_000_000)
            op = rng.choice(["read", "write", "write", "flush"])
            ready = rng.choice([None, None, fake.now - rng.randint(0, 10**6)])
            charged.append(timer.account(op, rng.choice([512, 4096, 1 << 20]), ready_ns=ready))
        snapshot = timer.snapshot()
        snapshot.pop("now_ns")
        snapshots.append((charged, snapshot))
    assert snapshots[0] == snapshots[1]


def test_the_c_model_is_built_and_runs_by_default() -> None:
    """No silent fallback: the package builds the C model, and it is what runs."""
    assert str(_model.__file__).endswith(".so")
    assert accel.reference is False
    assert type(VirtualClock()._lanes) is _model.Lanes


@pytest.mark.parametrize("seed", range(3))
def test_counters_count_the_same_on_random_plans(seed: int) -> None:
    rng = random.Random(seed)
    reference, native = EngineCounters(), _model.Counters()
    plan = None
    for _ in range(2000):
        capabilities, spec = random_capabilities(rng), random_spec(rng)
        planned = outcome(plan_calls, capabilities, spec, **random_request(rng))
        if isinstance(planned, tuple):
            continue
        plan = planned
        cpu_ns = rng.choice([0, 0.0, 0.5, 1.5, 2.5, rng.uniform(0, 1e7), rng.randint(0, 10**9)])
        reference.count(plan, cpu_ns)
        native.count(plan, cpu_ns)
        assert native.totals() == reference.totals()
    assert native.totals()[0] > 500
    odd = dataclasses.replace(plan, op="hash")  # type: ignore[arg-type]
    assert outcome(native.count, odd, 0) == outcome(reference.count, odd, 0)
    assert native.totals() == reference.totals()
    # Not a CallPlan: its fields are read by name, as the reference reads them.
    whole = SimpleNamespace(**{f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)})
    partial = SimpleNamespace(op="encrypt", calls=plan.calls)  # no fallback_reason
    requests = native.totals()[0]
    for duck in (whole, partial):
        assert outcome(native.count, duck, 1) == outcome(reference.count, duck, 1)
        assert native.totals() == reference.totals()
    assert native.totals()[0] == requests + 1  # the whole one counted, the partial one refused
