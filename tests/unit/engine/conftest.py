"""Engine tests that take ``engine_model`` run on the C hot path and on the Python reference."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from app.engine import _model, accel
from app.engine.planner import CallPlan, plan_calls


@pytest.fixture(params=["c", "python"])
def engine_model(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each implementation of the engine model, selected for the test and restored after."""
    before = accel.reference
    accel.use_reference(request.param == "python")
    try:
        yield str(request.param)
    finally:
        accel.use_reference(before)


def planner_of(name: str) -> Callable[..., CallPlan]:
    """``plan_calls`` of one implementation."""
    planner: Callable[..., Any] = plan_calls if name == "python" else _model.plan_calls
    return planner
