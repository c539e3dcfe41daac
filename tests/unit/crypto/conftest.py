"""Shared fixtures for the crypto tests: the transform implementations and CBC paths."""

from __future__ import annotations

import pytest

IMPLS = ("reference", "bulk")


@pytest.fixture(params=IMPLS)
def impl(request: pytest.FixtureRequest) -> str:
    return str(request.param)
