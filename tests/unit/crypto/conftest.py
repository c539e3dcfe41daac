"""Shared fixtures for the crypto tests: the transform implementations and CBC paths."""

from __future__ import annotations

import pytest

from app import _native

IMPLS = ("reference", "bulk")
CBC_PATHS = ("best", "aes-ni", "columns")


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
