"""Crypto engines: capabilities, the call planner, cost and device models, virtual time.

Owns what an engine can do (``model``), which calls a request becomes
(``planner``), what they cost (``cost``), virtual clocks and pacing
(``clock``), the one-request interface (``base``), the engine object
(``simulated``) and a scriptable one for tests (``mock``), presets and their
registry (``presets``, ``registry``) and the calibration fits (``fit``). The
per-request part (planning, a clock's lanes, an engine's counters) runs in C
(``_model``), the Python above being its reference; ``accel`` chooses.
Imports ``app.crypto`` contracts structurally, and ``app.errors``, ``app.integers``
and ``app.vocab``; never fastapi, sqlalchemy, ``app.blk`` or ``app.dm``.
"""

from app.engine.base import CryptTransformLike, Engine, EngineRequest, EngineResult, EngineStats
from app.engine.clock import ClockSnapshot, DeviceTimer, Reservation, VirtualClock
from app.engine.cost import ModelledWorkload, PlanCost, Prediction, plan_cost, predict_workload
from app.engine.mock import MockEngine
from app.engine.model import (
    Capabilities,
    CostModel,
    DeviceModel,
    EngineProfile,
    ModelSpec,
    SpecLike,
)
from app.engine.planner import CallPlan, EngineCall, plan_calls
from app.engine.presets import DEVICE_MODELS, ENGINES
from app.engine.registry import EngineRegistry, RegistryStore
from app.engine.simulated import SimulatedEngine

__all__ = [
    "DEVICE_MODELS",
    "ENGINES",
    "CallPlan",
    "Capabilities",
    "ClockSnapshot",
    "CostModel",
    "CryptTransformLike",
    "DeviceModel",
    "DeviceTimer",
    "Engine",
    "EngineCall",
    "EngineProfile",
    "EngineRegistry",
    "EngineRequest",
    "EngineResult",
    "EngineStats",
    "MockEngine",
    "ModelSpec",
    "ModelledWorkload",
    "PlanCost",
    "Prediction",
    "RegistryStore",
    "Reservation",
    "SimulatedEngine",
    "SpecLike",
    "VirtualClock",
    "plan_calls",
    "plan_cost",
    "predict_workload",
]
