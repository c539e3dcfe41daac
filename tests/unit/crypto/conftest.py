"""Shared helpers for the crypto tests: vector loading and transform pairs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

VECTORS = Path(__file__).parent / "vectors"
IMPLS = ("reference", "bulk")


def load_vectors(name: str) -> dict[str, Any]:
    return json.loads((VECTORS / name).read_text())


@pytest.fixture(params=IMPLS)
def impl(request: pytest.FixtureRequest) -> str:
    return str(request.param)
