"""Engine profiles and device timing models: presets, custom ones, live statistics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from app.api.deps import AdminDep, RoleDep, StateDep
from app.api.problems import responses
from app.engine.model import (
    MAX_BYTES_PER_CALL_LIMIT,
    MAX_CHANNELS,
    MAX_RATE,
    MAX_SEGMENTS_LIMIT,
    DeviceModel,
    EngineProfile,
)
from app.vocab import MODEL_NAME_PATTERN

router = APIRouter(tags=["engines"], responses=responses(401, 403))


class CapabilitiesIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    ciphers: list[str] | None = Field(default=None, description="None: every cipher")
    chainmodes: list[str] | None = Field(default=None, description="None: every chain mode")
    bulk_ivmodes: list[str] = Field(
        default_factory=list, description="IV modes derived per data unit from one IV"
    )
    keyed_iv: bool = Field(default=False, description="holds the ESSIV salt / EBOIV key")
    data_unit_sizes: list[int] = Field(default_factory=lambda: [512, 1024, 2048, 4096])
    max_bytes_per_call: int = Field(default=1 << 20, ge=512, le=MAX_BYTES_PER_CALL_LIMIT)
    max_segments_per_call: int = Field(default=128, ge=1, le=MAX_SEGMENTS_LIMIT)
    channels: int = Field(default=1, ge=1, le=MAX_CHANNELS)


class CostIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    setup_ns: float = Field(ge=0, description="fixed cost of one engine call")
    segment_ns: float = Field(default=0.0, ge=0)
    encrypt_bytes_per_s: float = Field(gt=0, le=MAX_RATE)
    decrypt_bytes_per_s: float = Field(gt=0, le=MAX_RATE)


class EngineIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(pattern=MODEL_NAME_PATTERN)
    description: str = ""
    capabilities: CapabilitiesIn
    cost: CostIn
    cpu_iv_ns: float = Field(default=0.0, ge=0, description="software IV cost per data unit")


class DeviceModelIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(pattern=MODEL_NAME_PATTERN)
    description: str = ""
    read_latency_ns: float = Field(default=0, ge=0)
    read_bytes_per_s: float | None = Field(default=None, gt=0, le=MAX_RATE)
    write_latency_ns: float = Field(default=0, ge=0)
    write_bytes_per_s: float | None = Field(default=None, gt=0, le=MAX_RATE)
    flush_ns: float = Field(default=0, ge=0)


def engine_view(state: StateDep, profile: EngineProfile) -> dict[str, Any]:
    return {
        **profile.to_dict(),
        "stats": state.engines.engine(profile.name).snapshot().to_dict(),
    }


@router.get("/v1/engines")
def list_engines(state: StateDep, _: RoleDep) -> list[dict[str, Any]]:
    return [engine_view(state, profile) for profile in state.engines.profiles()]


@router.get("/v1/engines/{name}", responses=responses(404))
def get_engine(name: str, state: StateDep, _: RoleDep) -> dict[str, Any]:
    """Capabilities, cost model and live stats: calls (bulk vs per-unit), bytes, busy time."""
    return engine_view(state, state.engines.profile(name))


@router.post("/v1/engines", status_code=201, responses=responses(409, 422))
def create_engine(body: EngineIn, state: StateDep, _: AdminDep) -> dict[str, Any]:
    profile = EngineProfile.from_dict({**body.model_dump(), "measured": False})
    state.engines.add_profile(profile)
    return engine_view(state, profile)


@router.get("/v1/device-models")
def list_device_models(state: StateDep, _: RoleDep) -> list[dict[str, Any]]:
    return [model.to_dict() for model in state.engines.device_models()]


@router.get("/v1/device-models/{name}", responses=responses(404))
def get_device_model(name: str, state: StateDep, _: RoleDep) -> dict[str, Any]:
    return {
        **state.engines.device_model(name).to_dict(),
        "stats": state.engines.device_timer(name).snapshot(),
    }


@router.post("/v1/device-models", status_code=201, responses=responses(409, 422))
def create_device_model(body: DeviceModelIn, state: StateDep, _: AdminDep) -> dict[str, Any]:
    model = DeviceModel.from_dict(body.model_dump())
    state.engines.add_device_model(model)
    return model.to_dict()
