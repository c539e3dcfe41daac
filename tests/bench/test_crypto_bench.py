"""Crypto throughput: reference (per unit) vs bulk vs one OpenSSL call, with targets.

Run on demand: ``.venv/bin/pytest tests/bench -m bench -s``. Medians of several runs
over 64 MiB (the reference is timed on a 4 MiB slice: it is linear and slow).
Bulk is measured twice: ``encrypt`` returns a fresh 64 MiB ``bytes`` (malloc'd, so
~0.5 ms/MiB of page faults here), ``encrypt_into`` writes into a caller buffer like
dm-crypt's bio_out pages; the throughput targets are asserted on ``encrypt_into``.
"""

from __future__ import annotations

import os
import statistics
import time
import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from app.crypto.keys import KeyMaterial
from app.crypto.spec import parse_cipher_spec
from app.crypto.transform import BulkTransform, ReferenceTransform

pytestmark = pytest.mark.bench

MIB = 1 << 20
SIZE = 64 * MIB
REFERENCE_SIZE = 4 * MIB
RUNS = 5


def _median_mbps(size: int, action: Callable[[], object], runs: int = RUNS) -> float:
    timings = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        timings.append(time.perf_counter() - start)
    return size / statistics.median(timings) / 1e6


def _openssl_single_call_mbps(text: str, key: bytes, data: bytes, encrypt: bool) -> float:
    """One OpenSSL call over the buffer (XTS: one per 16 MiB, OpenSSL's 2^20-block limit)."""
    out = np.empty(len(data) + 16, np.uint8)
    if text.startswith("aes-xts"):
        step = 16 * MIB

        def run() -> None:
            for offset in range(0, len(data), step):
                cipher = Cipher(algorithms.AES(key), modes.XTS(bytes(16)))
                context = cipher.encryptor() if encrypt else cipher.decryptor()
                context.update_into(data[offset : offset + step], out[offset:])
    else:

        def run() -> None:
            cipher = Cipher(algorithms.AES(key), modes.CBC(bytes(16)))
            context = cipher.encryptor() if encrypt else cipher.decryptor()
            context.update_into(data, out)

    return _median_mbps(len(data), run)


def _measure(text: str, key_size: int, sector_size: int) -> dict[str, float]:
    spec = parse_cipher_spec(text)
    key = KeyMaterial(os.urandom(key_size))
    data = os.urandom(SIZE)
    reference = ReferenceTransform(spec, key, sector_size=sector_size)
    bulk = BulkTransform(spec, key, sector_size=sector_size)
    ciphertext = bulk.encrypt(data, 0)
    out = bytearray(SIZE)
    small = data[:REFERENCE_SIZE]
    small_ct = ciphertext[:REFERENCE_SIZE]
    return {
        "ref_enc": _median_mbps(REFERENCE_SIZE, lambda: reference.encrypt(small, 0), runs=3),
        "ref_dec": _median_mbps(REFERENCE_SIZE, lambda: reference.decrypt(small_ct, 0), runs=3),
        "bulk_enc": _median_mbps(SIZE, lambda: bulk.encrypt(data, 0)),
        "bulk_dec": _median_mbps(SIZE, lambda: bulk.decrypt(ciphertext, 0)),
        "into_enc": _median_mbps(SIZE, lambda: bulk.encrypt_into(data, 0, out)),
        "into_dec": _median_mbps(SIZE, lambda: bulk.decrypt_into(ciphertext, 0, out)),
        "openssl_enc": _openssl_single_call_mbps(text, key.to_bytes(), data, True),
        "openssl_dec": _openssl_single_call_mbps(text, key.to_bytes(), data, False),
    }


def _print_row(label: str, figures: dict[str, float]) -> None:
    print(
        f"{label:34} "
        + " ".join(f"{name}={value:8.0f}" for name, value in figures.items())
        + " MB/s"
    )


@pytest.fixture(scope="module")
def xts_512() -> dict[str, float]:
    return _measure("aes-xts-plain64", 64, 512)


@pytest.fixture(scope="module")
def essiv_512() -> dict[str, float]:
    return _measure("aes-cbc-essiv:sha256", 32, 512)


def test_bulk_xts_plain64_at_512_bytes_is_12x_reference_and_over_1200_mbps(xts_512):
    _print_row("aes-xts-plain64 512", xts_512)
    assert xts_512["into_enc"] >= 12 * xts_512["ref_enc"]
    assert xts_512["into_dec"] >= 12 * xts_512["ref_dec"]
    assert xts_512["into_enc"] >= 1200
    assert xts_512["into_dec"] >= 1200


def test_bulk_cbc_essiv_at_512_bytes_is_10x_encrypt_and_20x_decrypt(essiv_512):
    _print_row("aes-cbc-essiv:sha256 512", essiv_512)
    assert essiv_512["into_enc"] >= 10 * essiv_512["ref_enc"]
    assert essiv_512["into_dec"] >= 20 * essiv_512["ref_dec"]


def test_bulk_aes_cbc_essiv_encrypts_512_byte_units_at_4_gbps_or_more(essiv_512):
    """Multi-lane CBC (VAES or AES-NI): CBC is serial within a unit, not across units."""
    _print_row("aes-cbc-essiv:sha256 512", essiv_512)
    assert essiv_512["into_enc"] >= 4000


@pytest.mark.parametrize(
    ("text", "key_size"), [("aes-xts-plain64", 64), ("aes-cbc-essiv:sha256", 32)]
)
def test_bulk_is_never_slower_than_reference_at_4096_bytes(text, key_size):
    figures = _measure(text, key_size, 4096)
    _print_row(f"{text} 4096", figures)
    for direction in ("enc", "dec"):
        assert figures[f"bulk_{direction}"] >= figures[f"ref_{direction}"]
        assert figures[f"into_{direction}"] >= figures[f"ref_{direction}"]


@pytest.mark.parametrize(
    ("text", "key_size"), [("aes-xts-plain64", 64), ("aes-cbc-essiv:sha256", 32)]
)
def test_bulk_call_peak_extra_memory_is_at_most_4x_the_request(text, key_size):
    bulk = BulkTransform(parse_cipher_spec(text), KeyMaterial(os.urandom(key_size)))
    data = os.urandom(SIZE)
    bulk.encrypt(data[: 4 * MIB], 0)  # warm the per-thread scratch buffers
    tracemalloc.start()
    try:
        result = bulk.encrypt(data, 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del result
    print(f"{text}: peak extra memory {peak / SIZE:.2f}x the request")
    assert peak <= 4 * SIZE
