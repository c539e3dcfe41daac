"""Shared helpers for the crypto tests: vector loading and transform pairs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app import _native

VECTORS = Path(__file__).parent / "vectors"
IMPLS = ("reference", "bulk")
CBC_PATHS = ("best", "aes-ni", "columns")


def load_vectors(name: str) -> dict[str, Any]:
    return json.loads((VECTORS / name).read_text())


@pytest.fixture(params=IMPLS)
def impl(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=CBC_PATHS)
def cbc_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """AES-CBC's bulk path: the best the CPU has (VAES lanes, and VAES decryption, here),
    AES-NI lanes (decryption through OpenSSL's ECB and numpy), or the numpy block columns of
    a CPU without AES instructions. The narrower paths are forced by hiding the module's CPU
    flags from transforms built afterwards."""
    path = str(request.param)
    if path != "best":
        monkeypatch.setattr(_native, "VAES", False)
    if path == "columns":
        monkeypatch.setattr(_native, "AESNI", False)
    return path
