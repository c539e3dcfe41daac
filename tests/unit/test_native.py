"""The C inner loops: AES-XTS and AES-CBC against pyca on every AES path this CPU runs,
whitening against GF(2^128) in Python ints."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import pickle
import resource
import sys
import threading
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from app import _native
from tests.support.aes_paths import ALL_PATHS

_Bytes = bytes | bytearray | memoryview | npt.NDArray[Any]

MASK128 = (1 << 128) - 1


def whiten_by_ints(data: bytes, first: bytes, unit_bytes: int) -> bytes:
    """IEEE 1619: block j of unit u is XORed with first[u] * x^j (little-endian 128-bit)."""
    out = bytearray()
    for unit in range(len(data) // unit_bytes):
        tweak = int.from_bytes(first[16 * unit : 16 * unit + 16], "little")
        for block in range(unit_bytes // 16):
            start = unit * unit_bytes + 16 * block
            value = int.from_bytes(data[start : start + 16], "little") ^ tweak
            out += value.to_bytes(16, "little")
            tweak = ((tweak << 1) & MASK128) ^ (0x87 if tweak >> 127 else 0)
    return bytes(out)


@pytest.mark.parametrize("unit_bytes", [16, 512, 4096])
def test_whiten_xors_each_block_with_its_tweak_times_x_to_the_j(unit_bytes: int) -> None:
    data = os.urandom(3 * unit_bytes)
    first = os.urandom(48)
    out = bytearray(len(data))
    _native.whiten(out, data, first, unit_bytes)
    assert bytes(out) == whiten_by_ints(data, first, unit_bytes)


def test_whiten_carries_the_top_bit_into_the_reduction() -> None:
    first = (1 << 127 | 1).to_bytes(16, "little")
    out = bytearray(512)
    _native.whiten(out, bytes(512), first, 512)
    assert bytes(out) == whiten_by_ints(bytes(512), first, 512)
    assert int.from_bytes(out[16:32], "little") == 0x87 ^ 0b10


def test_whiten_in_place_equals_out_of_place() -> None:
    data, first = os.urandom(1024), os.urandom(32)
    buffer = bytearray(data)
    _native.whiten(buffer, buffer, first, 512)
    assert bytes(buffer) == whiten_by_ints(data, first, 512)


@pytest.mark.parametrize(
    ("dst", "src", "first", "unit_bytes", "message"),
    [
        (512, 512, 16, 24, "multiple of 16"),
        (512, 1024, 32, 512, "same whole number of units"),
        (768, 768, 32, 512, "same whole number of units"),
        (1024, 1024, 16, 512, "16 bytes per data unit"),
    ],
)
def test_whiten_refuses_inconsistent_sizes(
    dst: int, src: int, first: int, unit_bytes: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        _native.whiten(bytearray(dst), bytes(src), bytes(first), unit_bytes)


def test_whiten_needs_a_writable_destination() -> None:
    with pytest.raises(TypeError):
        _native.whiten(bytes(512), bytes(512), bytes(16), 512)


def xts_by_pyca(data: bytes, ivs: bytes, key: bytes, unit_bytes: int, encrypt: bool) -> bytes:
    """One pyca AES-XTS operation per data unit, tweak = the unit's IV."""
    out = b""
    for unit in range(len(data) // unit_bytes):
        cipher = Cipher(algorithms.AES(key), modes.XTS(ivs[16 * unit : 16 * unit + 16]))
        context = cipher.encryptor() if encrypt else cipher.decryptor()
        out += context.update(data[unit * unit_bytes : (unit + 1) * unit_bytes])
    return out


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


PATH_FLAGS = {
    "avx512": {"aes", "pclmulqdq", "avx512f", "avx512bw", "vaes", "vpclmulqdq"},
    "avx2": {"aes", "pclmulqdq", "avx2", "vaes", "vpclmulqdq"},
    "aesni": {"aes", "pclmulqdq"},
    "openssl": set(),
}


def test_paths_are_those_the_cpu_flags_allow_fastest_first() -> None:
    """The kernel lists a flag only if the OS saves its registers (XCR0), as the module checks:
    otherwise a broken check would silently leave a CPU on a slower path, or crash it."""
    flags = cpu_flags()
    expected = tuple(name for name in ALL_PATHS if PATH_FLAGS[name] <= flags)
    assert expected == _native.PATHS


def test_calls_take_the_fastest_path_by_default() -> None:
    assert _native.path() == _native.PATHS[0]


@pytest.mark.parametrize("name", ALL_PATHS)
def test_set_path_takes_a_path_the_cpu_runs_and_refuses_one_it_lacks_naming_the_flags(
    name: str,
) -> None:
    before = _native.path()
    try:
        if name in _native.PATHS:
            _native.set_path(name)
            assert _native.path() == name
        else:
            with pytest.raises(
                RuntimeError, match=f"cannot run the {name} path: it needs aes(,| and) pclmulqdq"
            ):
                _native.set_path(name)
            assert _native.path() == before
    finally:
        _native.set_path(before)


def test_set_path_refuses_an_unknown_name() -> None:
    with pytest.raises(ValueError, match="unknown path 'vaes'"):
        _native.set_path("vaes")


@pytest.mark.parametrize("key_bytes", [32, 64])
@pytest.mark.parametrize(
    ("unit_bytes", "units"),
    [
        (512, 1),
        (512, 37),
        (512, 1025),
        (512, 64),
        (4096, 5),
        (4096, 33),
        (16384, 2),
        (48, 5),
        (304, 19),
        (1040, 3),
        (128, 17),
        (144, 9),
        (16, 9),
    ],
)
@pytest.mark.parametrize("encrypt", [True, False])
def test_xts_equals_pyca_aes_xts_unit_by_unit(
    aes_path: str, key_bytes: int, unit_bytes: int, units: int, encrypt: bool
) -> None:
    """Odd unit counts cross 8 KiB chunk edges mid-request and end part way through a group of
    first tweaks (8 units on ymm, 32 on zmm, made a group ahead); 64 units are two whole zmm
    groups, the last with none ahead; 1025 units are half a MiB; 16 KiB units exceed a chunk;
    48- and 304-byte units end 3 blocks past a 16-block step (an 8-block step on aesni). On
    aesni a 128-byte unit is one step; 144- and 16-byte units end a block past a step or before
    one, across groups of first tweaks."""
    data, ivs, key = os.urandom(units * unit_bytes), os.urandom(16 * units), os.urandom(key_bytes)
    out = bytearray(len(data))
    _native.xts(out, data, ivs, key, unit_bytes, encrypt)
    assert bytes(out) == xts_by_pyca(data, ivs, key, unit_bytes, encrypt)


@pytest.mark.parametrize("encrypt", [True, False])
def test_xts_in_place_equals_xts_into_another_buffer(aes_path: str, encrypt: bool) -> None:
    """Reads decrypt in place in the bio's pages."""
    data, ivs, key = os.urandom(19 * 4096), os.urandom(16 * 19), os.urandom(64)
    out = bytearray(len(data))
    _native.xts(out, data, ivs, key, 4096, encrypt)
    buffer = bytearray(data)
    _native.xts(buffer, buffer, ivs, key, 4096, encrypt)
    assert buffer == out


def misaligned(data: bytes, offset: int) -> memoryview:
    """data in a writable buffer offset bytes past a 64-byte boundary."""
    raw = np.zeros(len(data) + 128, np.uint8)
    start = -raw.ctypes.data % 64 + offset
    view = memoryview(raw)[start : start + len(data)]
    view[:] = data
    return view


@pytest.mark.parametrize("offset", [1, 8, 17, 63])
@pytest.mark.parametrize("encrypt", [True, False])
def test_xts_reads_and_writes_misaligned_buffers(aes_path: str, offset: int, encrypt: bool) -> None:
    data, ivs, key = os.urandom(9 * 512), os.urandom(16 * 9), os.urandom(64)
    out = misaligned(bytes(len(data)), offset)
    _native.xts(out, misaligned(data, 64 - offset), misaligned(ivs, offset), key, 512, encrypt)
    assert bytes(out) == xts_by_pyca(data, ivs, key, 512, encrypt)


def test_xts_aes_192_equals_openssl_ecb_construction_and_round_trips(aes_path: str) -> None:
    """pyca has no AES-192-XTS: every path must agree with the OpenSSL ECB construction (the
    openssl path), and decrypt(encrypt(x)) == x in place."""
    data, ivs, key = os.urandom(2048), os.urandom(64), os.urandom(48)
    buffer = bytearray(data)
    _native.xts(buffer, buffer, ivs, key, 512, True)
    _native.set_path("openssl")
    expected = bytearray(len(data))
    _native.xts(expected, data, ivs, key, 512, True)
    _native.set_path(aes_path)
    assert buffer == expected
    _native.xts(buffer, buffer, ivs, key, 512, False)
    assert buffer == data


@pytest.mark.parametrize(
    ("size", "ivs", "key", "unit_bytes", "message"),
    [
        (512, 16, 40, 512, "32, 48 or 64 bytes"),
        (512, 16, 64, 24, "multiple of 16"),
        (4 << 20, 64, 64, 2 << 20, "at most 1 MiB"),
        (768, 32, 64, 512, "same whole number of units"),
        (1024, 16, 64, 512, "16 bytes per data unit"),
    ],
)
def test_xts_refuses_inconsistent_arguments(
    size: int, ivs: int, key: int, unit_bytes: int, message: str
) -> None:
    out = bytearray(size)
    with pytest.raises(ValueError, match=message):
        _native.xts(out, bytes(size), bytes(ivs), bytes(key), unit_bytes, True)
    assert out == bytes(size)


def cbc_by_pyca(data: bytes, ivs: bytes, key: bytes, unit_bytes: int, encrypt: bool) -> bytes:
    """One pyca AES-CBC operation per data unit, starting from the unit's IV."""
    out = b""
    for unit in range(len(data) // unit_bytes):
        cipher = Cipher(algorithms.AES(key), modes.CBC(ivs[16 * unit : 16 * unit + 16]))
        context = cipher.encryptor() if encrypt else cipher.decryptor()
        out += context.update(data[unit * unit_bytes : (unit + 1) * unit_bytes])
    return out


def cbc(encrypt: bool) -> Callable[[_Bytes, _Bytes, _Bytes, bytes, int], None]:
    return _native.cbc_encrypt if encrypt else _native.cbc_decrypt


@pytest.mark.parametrize("key_bytes", [16, 24, 32])
@pytest.mark.parametrize(
    ("unit_bytes", "units"),
    [
        (512, 1),
        (512, 16),
        (512, 37),
        (512, 257),
        (4096, 5),
        (4096, 24),
        (16, 3),
        (48, 9),
        (48, 17),
        (272, 4),
        (272, 37),
        (528, 17),
    ],
)
@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("encrypt", [True, False], ids=["encrypt", "decrypt"])
def test_cbc_equals_pyca_aes_cbc_unit_by_unit(
    lane_path: str, key_bytes: int, unit_bytes: int, units: int, in_place: bool, encrypt: bool
) -> None:
    """Unit counts that fill the lanes (16 on avx512 and avx2, 8 on aesni) and counts that leave
    lanes empty in the last group (1, 5, 9, 37, 257); one- and three-block units (no whole
    decryption step); 272 bytes, a 16-block step and one block: the tail chains from the
    step's last ciphertext block. 17 and 37 units of 272 bytes and 17 of 528 (over 512 bytes:
    in squares): whole groups of lanes whose units end in blocks past the last square of
    blocks (4 on zmm, 2 on ymm)."""
    data, ivs, key = os.urandom(units * unit_bytes), os.urandom(16 * units), os.urandom(key_bytes)
    out = bytearray(data) if in_place else bytearray(len(data))
    cbc(encrypt)(out, out if in_place else data, ivs, key, unit_bytes)
    assert bytes(out) == cbc_by_pyca(data, ivs, key, unit_bytes, encrypt)


@pytest.mark.parametrize("offset", [1, 8, 17])
@pytest.mark.parametrize("encrypt", [True, False], ids=["encrypt", "decrypt"])
def test_cbc_reads_and_writes_misaligned_buffers(
    lane_path: str, offset: int, encrypt: bool
) -> None:
    data, ivs, key = os.urandom(19 * 512), os.urandom(16 * 19), os.urandom(32)
    out = misaligned(bytes(len(data)), offset)
    cbc(encrypt)(out, misaligned(data, 64 - offset), misaligned(ivs, offset), key, 512)
    assert bytes(out) == cbc_by_pyca(data, ivs, key, 512, encrypt)


@pytest.mark.parametrize("encrypt", [True, False], ids=["encrypt", "decrypt"])
def test_cbc_refuses_the_openssl_path(encrypt: bool) -> None:
    """The openssl path has no lanes: the bulk transform takes ECB and numpy instead."""
    before = _native.path()
    out = bytearray(512)
    _native.set_path("openssl")
    try:
        with pytest.raises(RuntimeError, match="current path is openssl"):
            cbc(encrypt)(out, bytes(512), bytes(16), bytes(32), 512)
    finally:
        _native.set_path(before)
    assert out == bytes(512)


def test_cbc_reads_one_iv_per_unit_even_from_a_longer_buffer(lane_path: str) -> None:
    data, ivs, key = os.urandom(3 * 512), os.urandom(16 * 5), os.urandom(32)
    out = bytearray(len(data))
    _native.cbc_encrypt(out, data, ivs, key, 512)
    assert bytes(out) == cbc_by_pyca(data, ivs[:48], key, 512, True)


@pytest.mark.parametrize(
    ("size", "ivs", "key", "unit_bytes", "message"),
    [
        (512, 16, 20, 512, "16, 24 or 32 bytes"),
        (512, 16, 32, 24, "positive multiple of 16"),
        (512, 16, 32, 0, "positive multiple of 16"),
        (768, 32, 32, 512, "same whole number of units"),
        (1024, 16, 32, 512, "16 bytes per data unit"),
    ],
)
@pytest.mark.parametrize("encrypt", [True, False], ids=["encrypt", "decrypt"])
def test_cbc_refuses_inconsistent_arguments(
    size: int, ivs: int, key: int, unit_bytes: int, message: str, encrypt: bool
) -> None:
    out = bytearray(size)
    with pytest.raises(ValueError, match=message):
        cbc(encrypt)(out, bytes(size), bytes(ivs), bytes(key), unit_bytes)
    assert out == bytes(size)


@pytest.mark.parametrize("encrypt", [True, False], ids=["encrypt", "decrypt"])
def test_cbc_needs_a_writable_destination(encrypt: bool) -> None:
    with pytest.raises(TypeError):
        cbc(encrypt)(bytes(512), bytes(512), bytes(16), bytes(32), 512)


@pytest.fixture
def page_before_a_guard() -> Iterator[memoryview]:
    """A page whose next page is unreadable (PROT_NONE): a read past its end faults."""
    pages = mmap.mmap(-1, 2 * mmap.PAGESIZE)
    anchor = ctypes.c_char.from_buffer(pages)
    libc = ctypes.CDLL(None, use_errno=True)
    address = ctypes.c_void_p(ctypes.addressof(anchor) + mmap.PAGESIZE)
    assert libc.mprotect(address, mmap.PAGESIZE, 0) == 0, os.strerror(ctypes.get_errno())
    view = memoryview(pages)[: mmap.PAGESIZE]
    yield view
    view.release()
    libc.mprotect(address, mmap.PAGESIZE, mmap.PROT_READ | mmap.PROT_WRITE)
    del anchor
    pages.close()


def ivs_at_the_end(page: memoryview, units: int) -> memoryview:
    """Random IVs for units data units in the last bytes of page."""
    ivs = page[mmap.PAGESIZE - 16 * units :]
    ivs[:] = os.urandom(16 * units)
    return ivs


@pytest.mark.parametrize("units", [1, 5, 18])
def test_cbc_encrypt_reads_no_iv_past_the_last_unit(
    page_before_a_guard: memoryview, lane_path: str, units: int
) -> None:
    """The IVs end where the readable memory ends; a lane past the last unit must not load one."""
    ivs = ivs_at_the_end(page_before_a_guard, units)
    data, key = os.urandom(units * 512), os.urandom(32)
    out = bytearray(len(data))
    _native.cbc_encrypt(out, data, ivs, key, 512)
    assert bytes(out) == cbc_by_pyca(data, bytes(ivs), key, 512, True)


@pytest.mark.parametrize("units", [1, 5, 18, 37])
def test_xts_reads_no_iv_past_the_last_unit(
    page_before_a_guard: memoryview, aes_path: str, units: int
) -> None:
    """The first tweaks are encrypted a group at a time, on zmm the next group's ahead (37
    units); a slot past the last unit loads none."""
    ivs = ivs_at_the_end(page_before_a_guard, units)
    data, key = os.urandom(units * 512), os.urandom(64)
    out = bytearray(len(data))
    _native.xts(out, data, ivs, key, 512, True)
    assert bytes(out) == xts_by_pyca(data, bytes(ivs), key, 512, True)


@pytest.mark.parametrize(
    ("first", "step", "units"),
    [(0, 1, 1), (12345, 8, 8), (7, 1, 37), (2**64 - 3, 1, 5), (2**64 - 8, 8, 4)],
    ids=["one-unit", "4k-step", "heap-ivs", "wraps", "wraps-by-8"],
)
@pytest.mark.parametrize("encrypt", [True, False])
def test_xts_plain64_equals_pyca_with_le64_sector_tweaks(
    aes_path: str, first: int, step: int, units: int, encrypt: bool
) -> None:
    """37 units need more IVs than the call keeps on its stack; the sector wraps like sector_t."""
    data, key = os.urandom(units * 512), os.urandom(64)
    ivs = b"".join(
        ((first + unit * step) % 2**64).to_bytes(8, "little") + bytes(8) for unit in range(units)
    )
    out = bytearray(len(data))
    _native.xts_plain64(out, data, first, step, key, 512, encrypt)
    assert bytes(out) == xts_by_pyca(data, ivs, key, 512, encrypt)


def test_xts_plain64_refuses_a_bad_key_or_unit_size() -> None:
    out = bytearray(1024)
    with pytest.raises(ValueError, match="key must be"):
        _native.xts_plain64(out, bytes(1024), 0, 1, bytes(20), 512, True)
    with pytest.raises(ValueError, match="unit_bytes"):
        _native.xts_plain64(out, bytes(1024), 0, 1, bytes(64), 100, True)
    assert out == bytes(1024)


@pytest.mark.parametrize("key_bytes", [32, 48, 64])
@pytest.mark.parametrize("encrypt", [True, False])
def test_xts_plain64_with_an_xts_key_equals_it_with_the_raw_key_on_every_path(
    aes_path: str, key_bytes: int, encrypt: bool
) -> None:
    """AES-192 has no kernel: its XtsKey goes through OpenSSL from the copy of the raw key."""
    data, key = os.urandom(8 * 512), os.urandom(key_bytes)
    xts_key = _native.XtsKey(key)
    by_key, by_raw = bytearray(len(data)), bytearray(len(data))
    _native.xts_plain64(by_key, data, 2**64 - 3, 1, xts_key, 512, encrypt)
    _native.xts_plain64(by_raw, data, 2**64 - 3, 1, key, 512, encrypt)
    assert by_key == by_raw
    if key_bytes != 48:
        ivs = b"".join(((2**64 - 3 + u) % 2**64).to_bytes(8, "little") + bytes(8) for u in range(8))
        assert bytes(by_key) == xts_by_pyca(data, ivs, key, 512, encrypt)


def test_an_xts_key_made_on_one_path_serves_every_path() -> None:
    """The schedules are expanded once, whatever path is current; set_path may change it later."""
    data, key = os.urandom(4096), os.urandom(64)
    xts_key = _native.XtsKey(key)
    expected = xts_by_pyca(data, (5).to_bytes(16, "little"), key, 4096, True)
    before = _native.path()
    try:
        for name in _native.PATHS:
            _native.set_path(name)
            out = bytearray(4096)
            _native.xts_plain64(out, data, 5, 8, xts_key, 4096, True)
            assert bytes(out) == expected, name
    finally:
        _native.set_path(before)


def test_an_xts_key_copies_the_key() -> None:
    key = bytearray(os.urandom(64))
    xts_key = _native.XtsKey(key)
    expected = xts_by_pyca(bytes(512), bytes(16), bytes(key), 512, True)
    key[:] = bytes(64)
    out = bytearray(512)
    _native.xts_plain64(out, bytes(512), 0, 1, xts_key, 512, True)
    assert bytes(out) == expected


def test_an_xts_key_refuses_a_bad_length_and_never_shows_the_key() -> None:
    with pytest.raises(ValueError, match="key must be 32, 48 or 64 bytes"):
        _native.XtsKey(bytes(20))
    xts_key = _native.XtsKey(bytes(range(64)))
    assert repr(xts_key).startswith("<app._native.XtsKey object at 0x")
    assert str(xts_key) == repr(xts_key)
    with pytest.raises(TypeError):
        pickle.dumps(xts_key)


def test_an_xts_key_refuses_keyword_arguments() -> None:
    with pytest.raises(TypeError, match="takes no keyword arguments"):
        _native.XtsKey(bytes(64), unit_bytes=512)


def test_the_one_call_conversions_convert_their_arguments_as_before() -> None:
    """xts_plain64 and cbc_essiv convert their arguments themselves, with PyArg_ParseTuple's
    rules: positional only, a writable contiguous dst, ints for the sectors (mod 2^64)."""
    xts_key, essiv_key = _native.XtsKey(bytes(64)), _native.EssivKey(bytes(32), bytes(32))
    calls: list[Callable[..., None]] = [
        lambda *a, **k: _native.xts_plain64(*a[:4], xts_key, *a[4:], **k),
        lambda *a, **k: _native.cbc_essiv(*a[:4], essiv_key, None, *a[4:], **k),
    ]
    for call in calls:
        with pytest.raises(TypeError, match="takes no keyword arguments"):
            call(bytearray(512), bytes(512), 0, 1, 512, encrypt=True)
        with pytest.raises(TypeError, match="takes exactly"):
            call(bytearray(512), bytes(512), 0, 1, 512)
        with pytest.raises(TypeError, match="argument 1 must be read-write bytes-like object"):
            call(bytes(512), bytes(512), 0, 1, 512, True)
        with pytest.raises(TypeError, match="argument 1 must be read-write bytes-like object"):
            call(np.zeros(1024, np.uint8)[::2], bytes(512), 0, 1, 512, True)
        with pytest.raises(ValueError, match="not C-contiguous"):
            call(bytearray(512), np.zeros(1024, np.uint8)[::2], 0, 1, 512, True)
        with pytest.raises(TypeError, match="argument 3 must be int, not float"):
            call(bytearray(512), bytes(512), 0.0, 1, 512, True)
        with pytest.raises(TypeError, match=r"argument 4 must be int, not numpy\.uint64"):
            call(bytearray(512), bytes(512), 0, np.uint64(1), 512, True)
        with pytest.raises(TypeError, match="cannot be interpreted as an integer"):
            call(bytearray(512), bytes(512), 0, 1, 512.0, True)
        with pytest.raises(OverflowError):
            call(bytearray(512), bytes(512), 0, 1, 2**64, True)
        with pytest.raises(TypeError, match="bytes-like object is required"):
            call(bytearray(512), "text", 0, 1, 512, True)
        wrapped, expected, by_index = bytearray(512), bytearray(512), bytearray(512)
        call(wrapped, bytes(512), 2**64 + 5, -1, 512, np.bool_(False))
        call(expected, bytes(512), 5, 2**64 - 1, 512, False)
        call(by_index, bytes(512), 5, 2**64 - 1, np.int64(512), 0)
        assert wrapped == expected == by_index != bytes(512)


def test_a_wiped_xts_key_refuses_to_convert() -> None:
    xts_key = _native.XtsKey(os.urandom(64))
    xts_key.wipe()
    out = bytearray(512)
    with pytest.raises(ValueError, match="wiped"):
        _native.xts_plain64(out, bytes(512), 0, 1, xts_key, 512, True)
    assert out == bytes(512)


RACE_BYTES = 64 << 20
"""Long enough that a wipe from another thread lands while the kernel still runs."""


def wipe_during(call: Callable[[], None], key: _native.XtsKey | _native.EssivKey) -> None:
    """Run call in a thread and wipe key from this one as soon as the call releases the GIL."""
    started = threading.Event()
    failures: list[BaseException] = []

    def run() -> None:
        started.set()
        try:
            call()
        except BaseException as error:  # re-raised in the test's thread
            failures.append(error)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(10.0)  # the thread keeps the GIL until the call releases it
    try:
        thread = threading.Thread(target=run)
        thread.start()
        started.wait()
        key.wipe()
    finally:
        sys.setswitchinterval(interval)
    thread.join()
    if failures:
        raise failures[0]


def test_wiping_an_xts_key_waits_for_a_call_running_on_it(lane_path: str) -> None:
    key, data = os.urandom(64), np.frombuffer(os.urandom(RACE_BYTES), np.uint8)
    expected, out = np.empty_like(data), np.zeros_like(data)
    _native.xts_plain64(expected, data, 0, 8, _native.XtsKey(key), 4096, True)
    xts_key = _native.XtsKey(key)
    wipe_during(lambda: _native.xts_plain64(out, data, 0, 8, xts_key, 4096, True), xts_key)
    assert np.array_equal(out, expected)
    with pytest.raises(ValueError, match="wiped"):
        _native.xts_plain64(out, data, 0, 8, xts_key, 4096, True)


def essiv_ivs_by_pyca(salt: bytes, first: int, step: int, units: int) -> bytes:
    """dm-crypt's essiv IVs: AES under the salt of each zero-padded le64 sector."""
    plain = b"".join(
        ((first + unit * step) % 2**64).to_bytes(8, "little") + bytes(8) for unit in range(units)
    )
    encryptor = Cipher(algorithms.AES(salt), modes.ECB()).encryptor()
    return encryptor.update(plain) + encryptor.finalize()


@pytest.mark.parametrize(("key_bytes", "salt_bytes"), [(16, 16), (24, 32), (32, 32), (32, 24)])
@pytest.mark.parametrize(
    ("unit_bytes", "units", "first", "step"),
    [
        (512, 1, 0, 1),
        (512, 7, 12345, 1),
        (512, 37, 2**64 - 3, 1),
        (512, 256, 99, 1),
        (512, 600, 2**64 - 300, 1),
        (4096, 9, 2**64 - 16, 8),
        (4096, 5, 77, 1),
        (48, 17, 5, 1),
        (272, 37, 3, 2),
    ],
)
@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("encrypt", [True, False], ids=["encrypt", "decrypt"])
def test_cbc_essiv_equals_pyca_cbc_with_essiv_ivs_unit_by_unit(
    lane_path: str,
    key_bytes: int,
    salt_bytes: int,
    unit_bytes: int,
    units: int,
    first: int,
    step: int,
    in_place: bool,
    encrypt: bool,
) -> None:
    """Unit counts short of one 8-block IV step (1, 7), of a group of lanes, exactly one
    256-unit chunk of IVs and across chunks (600); sectors that wrap at 2^64 like sector_t;
    steps of 8 (4096-byte units, 512-byte sectors) and 2; AES-192 salts."""
    data, key, salt = os.urandom(units * unit_bytes), os.urandom(key_bytes), os.urandom(salt_bytes)
    out = bytearray(data) if in_place else bytearray(len(data))
    _native.cbc_essiv(out, out if in_place else data, first, step, key, salt, unit_bytes, encrypt)
    ivs = essiv_ivs_by_pyca(salt, first, step, units)
    assert bytes(out) == cbc_by_pyca(data, ivs, key, unit_bytes, encrypt)


@pytest.mark.parametrize("offset", [1, 8, 17])
@pytest.mark.parametrize("encrypt", [True, False], ids=["encrypt", "decrypt"])
def test_cbc_essiv_reads_and_writes_misaligned_buffers(
    lane_path: str, offset: int, encrypt: bool
) -> None:
    data, key, salt = os.urandom(19 * 512), os.urandom(32), os.urandom(32)
    out = misaligned(bytes(len(data)), offset)
    _native.cbc_essiv(out, misaligned(data, 64 - offset), 8, 1, key, salt, 512, encrypt)
    ivs = essiv_ivs_by_pyca(salt, 8, 1, 19)
    assert bytes(out) == cbc_by_pyca(data, ivs, key, 512, encrypt)


@pytest.mark.parametrize("encrypt", [True, False], ids=["encrypt", "decrypt"])
def test_cbc_essiv_refuses_the_openssl_path(encrypt: bool) -> None:
    before = _native.path()
    out = bytearray(512)
    _native.set_path("openssl")
    try:
        with pytest.raises(RuntimeError, match="current path is openssl"):
            _native.cbc_essiv(out, bytes(512), 0, 1, bytes(32), bytes(32), 512, encrypt)
    finally:
        _native.set_path(before)
    assert out == bytes(512)


@pytest.mark.parametrize(
    ("size", "key", "salt", "unit_bytes", "message"),
    [
        (512, 20, 32, 512, "key must be 16, 24 or 32 bytes"),
        (512, 32, 20, 512, "salt must be 16, 24 or 32 bytes"),
        (512, 32, 32, 24, "positive multiple of 16"),
        (768, 32, 32, 512, "same whole number of units"),
    ],
)
def test_cbc_essiv_refuses_inconsistent_arguments(
    size: int, key: int, salt: int, unit_bytes: int, message: str
) -> None:
    out = bytearray(size)
    with pytest.raises(ValueError, match=message):
        _native.cbc_essiv(out, bytes(size), 0, 1, bytes(key), bytes(salt), unit_bytes, True)
    assert out == bytes(size)


@pytest.mark.parametrize(("key_bytes", "salt_bytes"), [(16, 16), (24, 32), (32, 24)])
@pytest.mark.parametrize("encrypt", [True, False], ids=["encrypt", "decrypt"])
def test_cbc_essiv_with_an_essiv_key_equals_it_with_the_raw_key_and_salt(
    lane_path: str, key_bytes: int, salt_bytes: int, encrypt: bool
) -> None:
    data, key, salt = os.urandom(9 * 512), os.urandom(key_bytes), os.urandom(salt_bytes)
    by_key, by_raw = bytearray(len(data)), bytearray(len(data))
    _native.cbc_essiv(by_key, data, 2**64 - 3, 1, _native.EssivKey(key, salt), None, 512, encrypt)
    _native.cbc_essiv(by_raw, data, 2**64 - 3, 1, key, salt, 512, encrypt)
    assert by_key == by_raw
    ivs = essiv_ivs_by_pyca(salt, 2**64 - 3, 1, 9)
    assert bytes(by_key) == cbc_by_pyca(data, ivs, key, 512, encrypt)


def test_an_essiv_key_made_on_one_path_serves_every_lane_path() -> None:
    """The schedules are expanded once, whatever path is current; set_path may change it later."""
    data, key, salt = os.urandom(4096), bytearray(os.urandom(32)), bytearray(os.urandom(32))
    essiv_key = _native.EssivKey(key, salt)
    expected = cbc_by_pyca(data, essiv_ivs_by_pyca(bytes(salt), 5, 8, 1), bytes(key), 4096, True)
    key[:], salt[:] = bytes(32), bytes(32)
    before = _native.path()
    try:
        for name in (path for path in _native.PATHS if path != "openssl"):
            _native.set_path(name)
            out = bytearray(4096)
            _native.cbc_essiv(out, data, 5, 8, essiv_key, None, 4096, True)
            assert bytes(out) == expected, name
    finally:
        _native.set_path(before)


def test_an_essiv_key_refuses_bad_arguments_and_never_shows_the_key() -> None:
    with pytest.raises(ValueError, match="key must be 16, 24 or 32 bytes"):
        _native.EssivKey(bytes(20), bytes(32))
    with pytest.raises(ValueError, match="salt must be 16, 24 or 32 bytes"):
        _native.EssivKey(bytes(32), bytes(20))
    with pytest.raises(TypeError, match="takes no keyword arguments"):
        _native.EssivKey(bytes(32), bytes(32), unit_bytes=512)
    essiv_key = _native.EssivKey(bytes(range(32)), bytes(range(32)))
    assert repr(essiv_key).startswith("<app._native.EssivKey object at 0x")
    assert str(essiv_key) == repr(essiv_key)
    with pytest.raises(TypeError):
        pickle.dumps(essiv_key)
    with pytest.raises(TypeError, match="salt must be None"):
        _native.cbc_essiv(bytearray(512), bytes(512), 0, 1, essiv_key, bytes(32), 512, True)


def test_a_wiped_essiv_key_refuses_to_convert(lane_path: str) -> None:
    essiv_key = _native.EssivKey(os.urandom(32), os.urandom(32))
    essiv_key.wipe()
    out = bytearray(512)
    with pytest.raises(ValueError, match="wiped"):
        _native.cbc_essiv(out, bytes(512), 0, 1, essiv_key, None, 512, True)
    assert out == bytes(512)


@pytest.mark.parametrize("encrypt", [True, False], ids=["encrypt", "decrypt"])
def test_wiping_an_essiv_key_waits_for_a_call_running_on_it(lane_path: str, encrypt: bool) -> None:
    key, salt = os.urandom(32), os.urandom(32)
    data = np.frombuffer(os.urandom(RACE_BYTES), np.uint8)
    expected, out = np.empty_like(data), np.zeros_like(data)
    _native.cbc_essiv(expected, data, 0, 8, _native.EssivKey(key, salt), None, 4096, encrypt)
    essiv_key = _native.EssivKey(key, salt)
    wipe_during(
        lambda: _native.cbc_essiv(out, data, 0, 8, essiv_key, None, 4096, encrypt), essiv_key
    )
    assert np.array_equal(out, expected)
    with pytest.raises(ValueError, match="wiped"):
        _native.cbc_essiv(out, data, 0, 8, essiv_key, None, 4096, encrypt)


@pytest.mark.parametrize("salt_bytes", [16, 24, 32])
@pytest.mark.parametrize("units", [0, 1, 37])
def test_essiv_is_aes_ecb_of_le64_sectors_by_pyca(salt_bytes: int, units: int) -> None:
    """The IVs dm-crypt's essiv makes: AES under the salt of each zero-padded le64 sector."""
    salt = os.urandom(salt_bytes)
    sectors = np.array([2**64 - 1, 0, *range(7, 7 + units)][:units], dtype=np.uint64)
    out = np.full((units, 16), 0xAA, dtype=np.uint8)
    _native.essiv(out, sectors, salt)
    plain = b"".join(int(sector).to_bytes(8, "little") + bytes(8) for sector in sectors)
    encryptor = Cipher(algorithms.AES(salt), modes.ECB()).encryptor()
    assert out.tobytes() == encryptor.update(plain) + encryptor.finalize()


def test_essiv_refuses_a_bad_salt_or_sizes() -> None:
    out = bytearray(32)
    with pytest.raises(ValueError, match="salt must be"):
        _native.essiv(out, bytes(16), bytes(20))
    with pytest.raises(ValueError, match="16 bytes per"):
        _native.essiv(out, bytes(8), bytes(16))
    with pytest.raises(ValueError, match="16 bytes per"):
        _native.essiv(out, bytes(12), bytes(16))
    assert out == bytes(32)


def thread_write_calls() -> int:
    """Write system calls this thread has made (the kernel's I/O accounting)."""
    for line in Path("/proc/thread-self/io").read_text().splitlines():
        if line.startswith("syscw:"):
            return int(line.split()[1])
    raise AssertionError("no syscw in /proc/thread-self/io")


@pytest.mark.parametrize(
    ("length", "chunk", "calls"), [(10, 3, 4), (12, 3, 4), (5, 8, 1), (0, 4, 0)]
)
def test_pwritev_chunks_writes_one_buffer_at_the_offset_one_call_per_chunk(
    tmp_path: Path, length: int, chunk: int, calls: int
) -> None:
    path = tmp_path / "file"
    path.write_bytes(b"." * 32)
    data = os.urandom(length)
    fd = os.open(path, os.O_RDWR)
    try:
        before = thread_write_calls()
        _native.pwritev_chunks(fd, [memoryview(data)], 7, chunk, 32)
        assert thread_write_calls() - before == calls
    finally:
        os.close(fd)
    assert path.read_bytes() == b"." * 7 + data + b"." * (25 - length)


def test_pwritev_chunks_of_one_buffer_raises_the_failed_calls_oserror(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_bytes(bytes(16))
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(OSError, match="Bad file descriptor") as raised:
            _native.pwritev_chunks(fd, [b"x" * 8], 0, 4, 16)
        assert raised.value.errno == errno.EBADF
        with pytest.raises(ValueError, match="chunk must be positive"):
            _native.pwritev_chunks(fd, [b"x"], 0, 0, 16)
    finally:
        os.close(fd)


def segments_of(data: bytes, rng: np.random.Generator) -> list[memoryview]:
    """``data`` cut at random points, each piece either a slice of one shared buffer (adjacent
    to its neighbour in memory) or a copy of its own; some pieces empty."""
    cuts = np.sort(rng.integers(0, len(data) + 1, size=rng.integers(0, 12)))
    bounds = [0, *cuts.tolist(), len(data)]
    shared = memoryview(bytearray(data))
    return [
        shared[a:b] if rng.random() < 0.6 else memoryview(bytearray(data[a:b]))
        for a, b in pairwise(bounds)
    ]


def test_pwritev_chunks_matches_one_write_of_the_joined_segments_in_chunk_sized_calls(
    tmp_path: Path,
) -> None:
    """Randomized: the bytes land as the segments joined would, in ceil(total / chunk) calls
    whatever the segments' layout in memory."""
    rng = np.random.default_rng(7)
    path = tmp_path / "file"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        for _ in range(300):
            model = bytearray(os.urandom(512))
            os.pwrite(fd, model, 0)
            data = os.urandom(int(rng.integers(0, 300)))
            offset, chunk = int(rng.integers(0, 200)), int(rng.integers(1, 90))
            before = thread_write_calls()
            _native.pwritev_chunks(fd, segments_of(data, rng), offset, chunk, 512)
            assert thread_write_calls() - before == -(-len(data) // chunk)
            model[offset : offset + len(data)] = data
            assert os.pread(fd, 512, 0) == model
    finally:
        os.close(fd)


def test_preadv_into_fills_the_segments_in_order_and_zeros_past_the_end_of_file(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(11)
    path = tmp_path / "file"
    content = os.urandom(400)
    path.write_bytes(content)
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(300):
            length, offset = int(rng.integers(0, 300)), int(rng.integers(0, 300))
            segments = segments_of(b"?" * length, rng)
            _native.preadv_into(fd, segments, offset, 1 << 20)
            expected = content[offset : offset + length]
            assert b"".join(segments) == expected + bytes(length - len(expected))
    finally:
        os.close(fd)


def test_vectored_calls_refuse_a_range_past_end_before_any_io(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_bytes(bytes(16))
    fd = os.open(path, os.O_RDWR)
    try:
        with pytest.raises(ValueError, match=r"range 8\+12 is outside the device \(16 bytes\)"):
            _native.pwritev_chunks(fd, [b"x" * 4, b"y" * 8], 8, 4, 16)
        into = bytearray(b"?" * 8)
        with pytest.raises(ValueError, match="outside the device"):
            _native.preadv_into(fd, [into], -1, 16)
        with pytest.raises(ValueError, match="chunk must be positive"):
            _native.pwritev_chunks(fd, [b"x"], 0, 0, 16)
        with pytest.raises(BufferError):
            _native.preadv_into(fd, [into, b"read-only"], 0, 16)
    finally:
        os.close(fd)
    assert path.read_bytes() == bytes(16)
    assert into == b"?" * 8


def test_pwritev_chunks_carries_on_after_a_short_write_and_raises_the_error_that_stops_it(
    tmp_path: Path,
) -> None:
    """RLIMIT_FSIZE cuts a write short at the limit, then fails the next with EFBIG (Python
    ignores SIGXFSZ): everything before the limit lands, then OSError."""
    path = tmp_path / "file"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    data = os.urandom(3000)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, hard))
        with pytest.raises(OSError, match="too large") as raised:
            _native.pwritev_chunks(fd, [data[:700], data[700:]], 0, 2048, 1 << 20)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        os.close(fd)
    assert raised.value.errno == errno.EFBIG
    assert path.read_bytes() == data[:1000]
