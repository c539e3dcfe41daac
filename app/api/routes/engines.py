"""Engine profiles and device timing models: presets, custom ones, live statistics.

The request and response schemas are ``app.engine.model``'s dataclasses
themselves, so the API, validation and the persisted JSON cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from fastapi import APIRouter

from app.api.deps import AdminDep, RoleDep, StateDep
from app.api.problems import responses
from app.engine.model import DeviceModel, EngineProfile

router = APIRouter(tags=["engines"], responses=responses(401, 403))


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineView(EngineProfile):
    """An engine with its live counters: calls (bulk vs per-unit), bytes, virtual clock."""

    stats: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceModelView(DeviceModel):
    """A device model with its live clock: I/Os per op, busy time, queue waits."""

    stats: dict[str, Any]


def engine_view(state: StateDep, profile: EngineProfile) -> EngineView:
    stats = state.engines.engine(profile.name).snapshot().to_dict()
    return EngineView(**{f.name: getattr(profile, f.name) for f in fields(profile)}, stats=stats)


@router.get("/v1/engines")
def list_engines(state: StateDep, _: RoleDep) -> list[EngineView]:
    return [engine_view(state, profile) for profile in state.engines.profiles()]


@router.get("/v1/engines/{name}", responses=responses(404))
def get_engine(name: str, state: StateDep, _: RoleDep) -> EngineView:
    """Capabilities, cost model and live stats: calls (bulk vs per-unit), bytes, busy time."""
    return engine_view(state, state.engines.profile(name))


@router.post("/v1/engines", status_code=201, responses=responses(409, 422))
def create_engine(body: EngineProfile, state: StateDep, _: AdminDep) -> EngineView:
    """A custom modelled engine (``measured`` must stay false); persisted, shared by name."""
    state.engines.add_profile(body)
    return engine_view(state, body)


@router.get("/v1/device-models")
def list_device_models(state: StateDep, _: RoleDep) -> list[DeviceModel]:
    return state.engines.device_models()


@router.get("/v1/device-models/{name}", responses=responses(404))
def get_device_model(name: str, state: StateDep, _: RoleDep) -> DeviceModelView:
    model = state.engines.device_model(name)
    stats = state.engines.device_timer(name).snapshot()
    return DeviceModelView(**{f.name: getattr(model, f.name) for f in fields(model)}, stats=stats)


@router.post("/v1/device-models", status_code=201, responses=responses(409, 422))
def create_device_model(body: DeviceModel, state: StateDep, _: AdminDep) -> DeviceModel:
    state.engines.add_device_model(body)
    return body
