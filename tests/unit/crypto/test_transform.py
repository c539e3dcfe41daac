"""Transforms: dm-crypt geometry, bulk == reference, round trips, independent models."""

from __future__ import annotations

import hashlib
import os
import random
import struct

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import _native
from app.crypto import _ciphers
from app.crypto.keys import KeyMaterial
from app.crypto.spec import parse_cipher_spec
from app.crypto.transform import BulkTransform, ReferenceTransform, make_transform
from app.errors import CipherSpecError, KeyNotSet

BULK_SPECS = [
    "aes-xts-plain64",
    "capi:xts(aes)-plain64",
    "aes-xts-plain",
    "aes-xts-benbi",
    "aes-cbc-essiv:sha256",
    "aes-cbc-essiv:md5",
    "aes-cbc-plain",
    "aes-cbc-plain64",
    "aes-cbc-plain64be",
    "aes-cbc-benbi",
    "aes-cbc-null",
    "aes-cbc-eboiv",
    "aes-ctr-plain64",
    "aes-ctr-benbi",
    "aes-ecb",
    "aes:2-cbc-essiv:sha256",
    "aes:4-xts-plain64",
    "camellia-xts-plain64",
    "camellia-cbc-essiv:sha256",
    "sm4-xts-plain64",
    "sm4-cbc-essiv:md5",
    "seed-cbc-plain64",
    "des3_ede-cbc-plain64",
    "blowfish-cbc-benbi",
    "cast5-ecb",
    "cipher_null-ecb",
]
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def geometries(draw, specs=BULK_SPECS):
    spec = parse_cipher_spec(draw(st.sampled_from(specs)))
    size = draw(st.sampled_from(spec.valid_key_sizes))
    key = KeyMaterial(random.Random(draw(st.integers(0, 2**32))).randbytes(size))
    sector_size = draw(st.sampled_from([512, 1024, 2048, 4096]))
    step = sector_size // 512
    iv_offset = step * draw(st.one_of(st.integers(0, 1000), st.integers(0, (2**64 - 1) // step)))
    large = draw(st.booleans())
    sector = step * draw(st.integers(0, 10_000))
    units = draw(st.integers(1, 40))
    return spec, key, sector_size, iv_offset, large, sector, units


def _pair(spec, key, sector_size, iv_offset, large):
    geometry = {"sector_size": sector_size, "iv_offset": iv_offset, "iv_large_sectors": large}
    return ReferenceTransform(spec, key, **geometry), BulkTransform(spec, key, **geometry)


def _assert_bulk_equals_reference(case, seed):
    spec, key, sector_size, iv_offset, large, sector, units = case
    reference, bulk = _pair(spec, key, sector_size, iv_offset, large)
    data = random.Random(seed).randbytes(units * sector_size)
    ciphertext = reference.encrypt(data, sector)
    assert bulk.encrypt(data, sector) == ciphertext
    assert bulk.decrypt(ciphertext, sector) == reference.decrypt(ciphertext, sector) == data


@FAST
@given(geometries(), st.integers(0, 2**32))
def test_bulk_equals_reference_for_any_geometry(case, seed):
    _assert_bulk_equals_reference(case, seed)


AES_PATH_SPECS = [text for text in BULK_SPECS if "aes" in text and ("cbc" in text or "xts" in text)]


@settings(FAST, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(geometries(AES_PATH_SPECS), st.integers(0, 2**32))
def test_bulk_aes_cbc_and_xts_equal_reference_on_each_aes_path(aes_path, case, seed):
    _assert_bulk_equals_reference(case, seed)


@FAST
@given(geometries(), st.data())
def test_segments_equal_one_contiguous_request(case, data):
    spec, key, sector_size, iv_offset, large, sector, _ = case
    reference, bulk = _pair(spec, key, sector_size, iv_offset, large)
    counts = data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=24))
    segments = [os.urandom(count * sector_size) for count in counts]
    expected = reference.encrypt(b"".join(segments), sector)
    for transform in (reference, bulk):
        encrypted = transform.encrypt_segments(segments, sector)
        assert [len(part) for part in encrypted] == [len(part) for part in segments]
        assert b"".join(encrypted) == expected
        assert transform.decrypt_segments(encrypted, sector) == segments


class _OverlapRefusingContext:
    """A pyca ECB context that refuses an output overlapping its input, as cryptography 51
    does, whichever release is installed."""

    def __init__(self, context):
        self._context = context

    def update(self, data):
        return self._context.update(data)

    def update_into(self, data, buf):
        if np.shares_memory(np.frombuffer(data, np.uint8), np.frombuffer(buf, np.uint8)):
            raise ValueError("data and buf must not overlap")
        return self._context.update_into(data, buf)


PYCA_SPECS = [text for text in BULK_SPECS if not text.startswith(("aes", "cipher_null"))]


@pytest.mark.parametrize("text", PYCA_SPECS)
@pytest.mark.parametrize("in_place", [False, True])
def test_bulk_never_hands_pyca_overlapping_buffers(monkeypatch, text, in_place):
    ecb = _ciphers.ecb
    monkeypatch.setattr(
        _ciphers, "ecb", lambda *args, **kwargs: _OverlapRefusingContext(ecb(*args, **kwargs))
    )
    spec = parse_cipher_spec(text)
    key = KeyMaterial(random.Random(text).randbytes(spec.valid_key_sizes[-1]))
    reference, bulk = _pair(spec, key, 512, 0, False)
    data = random.Random(1).randbytes(256 * 512)
    ciphertext = reference.encrypt(data, 40)
    out = bytearray(data) if in_place else bytearray(len(data))
    bulk.encrypt_into(out if in_place else data, 40, out)
    assert out == ciphertext
    bulk.decrypt_into(out, 40, out)
    assert out == data


@FAST
@given(
    geometries(["aes-cbc-lmk", "aes:64-cbc-lmk", "capi:cbc(aes)-lmk", "aes-cbc-tcw"]),
    st.integers(0, 2**32),
)
def test_data_dependent_iv_modes_round_trip(case, seed):
    spec, key, _, iv_offset, _, sector, units = case
    transform = make_transform(spec, key, iv_offset=iv_offset)
    plaintext = random.Random(seed).randbytes(units * 512)
    ciphertext = transform.encrypt(plaintext, sector)
    assert ciphertext != plaintext
    assert transform.decrypt(ciphertext, sector) == plaintext


def test_encrypt_into_writes_the_same_bytes_as_encrypt():
    transform = make_transform(parse_cipher_spec("aes-xts-plain64"), KeyMaterial(os.urandom(64)))
    data = os.urandom(64 * 512)
    out = bytearray(len(data))
    transform.encrypt_into(data, 8, out)
    assert bytes(out) == transform.encrypt(data, 8)
    back = bytearray(len(data))
    transform.decrypt_into(out, 8, back)
    assert back == data


def test_encrypt_into_takes_flat_views_and_others_alike_in_place_or_not():
    """A flat byte view is used as it is; a view of another shape is cast first: the same bytes
    either way, in place or into a buffer apart."""
    transform = make_transform(parse_cipher_spec("aes-xts-plain64"), KeyMaterial(os.urandom(64)))
    data = os.urandom(16 * 512)
    expected = transform.encrypt(data, 8)

    def views() -> list[memoryview]:
        """Each over its own copy of ``data``."""
        return [
            memoryview(bytearray(data)),
            memoryview(bytearray(data)).cast("I"),
            memoryview(bytearray(data)).cast("B", (16, 512)),
            memoryview(bytearray(data))[:],
        ]

    for view in views():
        transform.encrypt_into(view, 8, view)  # in place
        assert view.tobytes() == expected
    for view in views():
        out = bytearray(len(data))
        transform.encrypt_into(view, 8, memoryview(out).cast("I"))
        assert bytes(out) == expected
    strided = memoryview(bytearray(2 * len(data)))[::2]
    with pytest.raises(TypeError):
        transform.encrypt_into(strided, 8, bytearray(len(data)))


@settings(FAST, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(geometries(["aes-xts-plain64", "capi:xts(aes)-plain64"]), st.integers(0, 2**32))
def test_xts_plain64_into_equals_reference_for_any_geometry(aes_path, case, seed):
    """encrypt_into/decrypt_into (the data path's calls) take the native plain64 path, on each
    AES path; iv_offset near 2^64 wraps the sector as sector_t does."""
    spec, key, sector_size, iv_offset, large, sector, units = case
    reference, bulk = _pair(spec, key, sector_size, iv_offset, large)
    data = random.Random(seed).randbytes(units * sector_size)
    ciphertext = reference.encrypt(data, sector)
    out = bytearray(len(data))
    bulk.encrypt_into(data, sector, out)
    assert out == ciphertext
    back = bytearray(len(data))
    bulk.decrypt_into(ciphertext, sector, back)
    assert back == data


@pytest.mark.parametrize("large", [False, True])
def test_xts_plain64_into_wraps_at_the_top_of_sector_t_like_reference(large):
    spec, key = parse_cipher_spec("aes-xts-plain64"), KeyMaterial(os.urandom(64))
    reference, bulk = _pair(spec, key, 4096, 2**64 - 8, large)
    data = os.urandom(3 * 4096)
    out = bytearray(len(data))
    bulk.encrypt_into(data, 0, out)
    assert out == reference.encrypt(data, 0)


@settings(FAST, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    geometries(
        [
            "aes-cbc-essiv:sha256",
            "capi:cbc(aes)-essiv:sha256",
            "aes-cbc-essiv:md5",
            "aes:2-cbc-essiv:sha256",
        ]
    ),
    st.integers(0, 2**32),
)
def test_cbc_essiv_into_equals_reference_for_any_geometry(aes_path, case, seed):
    """encrypt_into/decrypt_into take the one-call native path with one key on a lane path,
    and the chunked route otherwise (keycount 2, the openssl path)."""
    spec, key, sector_size, iv_offset, large, sector, units = case
    reference, bulk = _pair(spec, key, sector_size, iv_offset, large)
    data = random.Random(seed).randbytes(units * sector_size)
    ciphertext = reference.encrypt(data, sector)
    out = bytearray(len(data))
    bulk.encrypt_into(data, sector, out)
    assert out == ciphertext
    back = bytearray(len(data))
    bulk.decrypt_into(ciphertext, sector, back)
    assert back == data


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("encrypt", [True, False])
def test_cbc_essiv_wraps_at_the_top_of_sector_t_like_reference(aes_path, large, encrypt):
    spec, key = parse_cipher_spec("aes-cbc-essiv:sha256"), KeyMaterial(os.urandom(32))
    reference, bulk = _pair(spec, key, 4096, 2**64 - 8, large)
    data = os.urandom(3 * 4096)
    out = bytearray(len(data))
    (bulk.encrypt_into if encrypt else bulk.decrypt_into)(data, 0, out)
    assert out == (reference.encrypt if encrypt else reference.decrypt)(data, 0)


@pytest.mark.parametrize("encrypt", [True, False])
def test_cbc_essiv_is_one_native_call_per_request_on_a_lane_path(lane_path, monkeypatch, encrypt):
    """No separate IV pass and no per-chunk call: the chunked route's natives are not reached,
    even for a request of several 2 MiB chunks."""
    spec, key = parse_cipher_spec("aes-cbc-essiv:sha256"), KeyMaterial(os.urandom(32))
    reference = ReferenceTransform(spec, key)
    bulk = BulkTransform(spec, key)
    data = os.urandom(5 << 20)
    expected = (reference.encrypt if encrypt else reference.decrypt)(data, 8)
    calls = []
    real = _native.cbc_essiv
    monkeypatch.setattr(_native, "cbc_essiv", lambda *args: calls.append(1) or real(*args))
    for name in ("essiv", "cbc_encrypt", "cbc_decrypt"):
        monkeypatch.setattr(_native, name, None)
    out = bytearray(len(data))
    (bulk.encrypt_into if encrypt else bulk.decrypt_into)(data, 8, out)
    assert out == expected
    assert (bulk.encrypt if encrypt else bulk.decrypt)(data, 8) == expected
    assert len(calls) == 2


# -- independent per-unit models (cryptography's own XTS / CBC, no app code) -----------


def _model_xts_plain64(key: bytes, data: bytes, sector: int, iv_offset: int) -> bytes:
    out = b""
    for index in range(len(data) // 512):
        tweak = ((sector + iv_offset + index) % 2**64).to_bytes(16, "little")
        encryptor = Cipher(algorithms.AES(key), modes.XTS(tweak)).encryptor()
        out += encryptor.update(data[index * 512 : (index + 1) * 512]) + encryptor.finalize()
    return out


def _model_cbc_essiv_sha256(key: bytes, data: bytes, sector: int, iv_offset: int) -> bytes:
    salt = hashlib.sha256(key).digest()
    out = b""
    for index in range(len(data) // 512):
        plain_iv = struct.pack("<Q", (sector + iv_offset + index) % 2**64) + bytes(8)
        iv_encryptor = Cipher(algorithms.AES(salt), modes.ECB()).encryptor()
        iv = iv_encryptor.update(plain_iv) + iv_encryptor.finalize()
        encryptor = Cipher(algorithms.AES(key), modes.CBC(iv)).encryptor()
        out += encryptor.update(data[index * 512 : (index + 1) * 512]) + encryptor.finalize()
    return out


@pytest.mark.parametrize(
    ("text", "key_size", "model"),
    [
        ("aes-xts-plain64", 64, _model_xts_plain64),
        ("aes-xts-plain64", 32, _model_xts_plain64),
        ("aes-cbc-essiv:sha256", 32, _model_cbc_essiv_sha256),
        ("aes-cbc-essiv:sha256", 16, _model_cbc_essiv_sha256),
    ],
)
@pytest.mark.parametrize("iv_offset", [0, 12345, 2**64 - 3])
def test_matches_an_independent_per_sector_model(text, key_size, model, iv_offset, impl, aes_path):
    key = os.urandom(key_size)
    transform = make_transform(
        parse_cipher_spec(text), KeyMaterial(key), iv_offset=iv_offset, impl=impl
    )
    data = os.urandom(24 * 512)
    expected = model(key, data, 40, iv_offset)
    assert transform.encrypt(data, 40) == expected
    assert transform.decrypt(expected, 40) == data


def _cbc_iv(ivmode: str, key: bytes, iv_sector: int) -> bytes:
    """dm-crypt's IV for AES-CBC, from its definition (dm-crypt.rst), with pyca alone."""
    if ivmode == "plain64":
        return iv_sector.to_bytes(16, "little")
    if ivmode == "benbi":  # count of 16-byte blocks, from 1, big-endian in the last 8 bytes
        return bytes(8) + ((iv_sector << 5) + 1).to_bytes(8, "big")
    salt = hashlib.sha256(key).digest()
    return (
        Cipher(algorithms.AES(salt), modes.ECB())
        .encryptor()
        .update(iv_sector.to_bytes(16, "little"))
    )


@pytest.mark.parametrize("ivmode", ["essiv:sha256", "plain64", "benbi"])
@pytest.mark.parametrize("key_size", [16, 24, 32])
@pytest.mark.parametrize(
    ("sector_size", "units"), [(512, 1), (512, 16), (512, 37), (512, 300), (4096, 3), (4096, 21)]
)
def test_bulk_aes_cbc_encryption_equals_pyca_cbc_unit_by_unit(
    aes_path, ivmode, key_size, sector_size, units
):
    """Unit counts that fill the lanes and counts that leave the last group part empty."""
    key = os.urandom(key_size)
    transform = BulkTransform(
        parse_cipher_spec(f"aes-cbc-{ivmode}"), KeyMaterial(key), sector_size=sector_size
    )
    sector = 8 * random.randrange(1 << 40)
    data = os.urandom(units * sector_size)
    expected = b""
    for unit in range(units):
        iv = _cbc_iv(ivmode, key, sector + unit * sector_size // 512)
        encryptor = Cipher(algorithms.AES(key), modes.CBC(iv)).encryptor()
        expected += encryptor.update(data[unit * sector_size : (unit + 1) * sector_size])
    out = bytearray(len(data))
    transform.encrypt_into(data, sector, out)
    assert out == expected
    assert transform.encrypt(data, sector) == expected
    assert transform.decrypt(expected, sector) == data


def test_negative_control_model_with_shifted_iv_offset_differs():
    key = os.urandom(64)
    transform = make_transform(parse_cipher_spec("aes-xts-plain64"), KeyMaterial(key))
    data = bytes(4 * 512)
    assert transform.encrypt(data, 0) != _model_xts_plain64(key, data, 0, 1)


# -- geometry and kernel semantics -----------------------------------------------------


def _zero_unit_iv_probe(text, key, **geometry):
    """Encrypt zero units: with cbc, block 0 of unit i is E(iv_i), so IVs can be compared."""
    return make_transform(parse_cipher_spec(text), KeyMaterial(key), impl="reference", **geometry)


def test_iv_sector_counts_512_byte_sectors_without_iv_large_sectors():
    key = os.urandom(64)
    big = _zero_unit_iv_probe("aes-xts-plain64", key, sector_size=4096)
    small = _zero_unit_iv_probe("aes-xts-plain64", key)
    # Unit 1 of a 4096-byte geometry has cc_sector 8: same tweak as 512-byte sector 8.
    unit = bytes(512)
    assert big.encrypt(bytes(8192), 0)[4096 : 4096 + 512] == small.encrypt(unit, 8)


def test_iv_large_sectors_counts_data_units():
    key = os.urandom(64)
    big = _zero_unit_iv_probe("aes-xts-plain64", key, sector_size=4096, iv_large_sectors=True)
    small = _zero_unit_iv_probe("aes-xts-plain64", key)
    assert big.encrypt(bytes(8192), 0)[4096 : 4096 + 512] == small.encrypt(bytes(512), 1)


def test_iv_offset_is_added_to_the_sector():
    key = os.urandom(32)
    shifted = _zero_unit_iv_probe("aes-cbc-plain64", key, iv_offset=100)
    plain = _zero_unit_iv_probe("aes-cbc-plain64", key)
    assert shifted.encrypt(bytes(512), 5) == plain.encrypt(bytes(512), 105)


def test_plain_iv_wraps_at_2_to_the_32():
    key = os.urandom(16)
    transform = _zero_unit_iv_probe("aes-cbc-plain", key)
    assert transform.encrypt(bytes(512), 2**32 + 7) == transform.encrypt(bytes(512), 7)


def test_plain64_iv_does_not_wrap_at_2_to_the_32():
    transform = _zero_unit_iv_probe("aes-cbc-plain64", os.urandom(16))
    assert transform.encrypt(bytes(512), 2**32 + 7) != transform.encrypt(bytes(512), 7)


def test_cc_sector_wraps_at_2_to_the_64():
    key = os.urandom(32)
    wrapped = _zero_unit_iv_probe("aes-cbc-plain64", key, iv_offset=2**64 - 1)
    plain = _zero_unit_iv_probe("aes-cbc-plain64", key)
    assert wrapped.encrypt(bytes(1024), 0)[512:] == plain.encrypt(bytes(512), 0)


def test_key_index_is_cc_sector_modulo_keycount():
    key = os.urandom(32)
    multi = _zero_unit_iv_probe("aes:2-cbc-plain64", key)
    first = _zero_unit_iv_probe("aes-cbc-plain64", key[:16])
    second = _zero_unit_iv_probe("aes-cbc-plain64", key[16:])
    assert multi.encrypt(bytes(512), 6) == first.encrypt(bytes(512), 6)
    assert multi.encrypt(bytes(512), 7) == second.encrypt(bytes(512), 7)


def test_benbi_iv_is_big_endian_narrow_block_count_plus_one():
    key = os.urandom(16)
    benbi = _zero_unit_iv_probe("aes-cbc-benbi", key)
    be = _zero_unit_iv_probe("aes-cbc-plain64be", key)
    # benbi(sector) = be64((sector << 5) + 1): sector 3 -> 97.
    assert benbi.encrypt(bytes(512), 3) == be.encrypt(bytes(512), 97)


def test_xts_with_equal_key_halves_is_accepted_like_the_kernel():
    key = KeyMaterial(bytes(64))
    reference, bulk = _pair(parse_cipher_spec("aes-xts-plain64"), key, 512, 0, False)
    data = os.urandom(4096)
    assert bulk.encrypt(data, 3) == reference.encrypt(data, 3)
    assert reference.decrypt(reference.encrypt(data, 3), 3) == data


def test_xts_with_two_192_bit_keys_is_supported():
    reference, bulk = _pair(
        parse_cipher_spec("aes-xts-plain64"), KeyMaterial(os.urandom(48)), 512, 0, False
    )
    data = os.urandom(2048)
    assert bulk.encrypt(data, 0) == reference.encrypt(data, 0)


@pytest.mark.parametrize(("length", "sector"), [(100, 0), (512, 0), (4096, 3)])
def test_misaligned_request_raises_value_error(length, sector):
    transform = make_transform(
        parse_cipher_spec("aes-xts-plain64"), KeyMaterial(os.urandom(64)), sector_size=4096
    )
    with pytest.raises(ValueError, match=r"multiple of sector_size|not aligned"):
        transform.encrypt(bytes(length), sector)


def test_segment_that_is_not_whole_units_raises_value_error():
    transform = make_transform(
        parse_cipher_spec("aes-xts-plain64"), KeyMaterial(os.urandom(64)), sector_size=1024
    )
    with pytest.raises(ValueError, match="multiple of sector_size"):
        transform.encrypt_segments([bytes(1024), bytes(512)], 0)


def test_iv_offset_must_be_aligned_to_sector_size():
    with pytest.raises(CipherSpecError, match="iv_offset"):
        make_transform(
            parse_cipher_spec("aes-xts-plain64"),
            KeyMaterial(bytes(64)),
            sector_size=4096,
            iv_offset=3,
        )


@pytest.mark.parametrize("text", ["aes-cbc-lmk", "aes-cbc-tcw"])
def test_lmk_and_tcw_need_512_byte_units(text):
    spec = parse_cipher_spec(text)
    with pytest.raises(CipherSpecError, match="sector size"):
        make_transform(spec, KeyMaterial(bytes(spec.valid_key_sizes[0])), sector_size=4096)


@pytest.mark.parametrize("text", ["aes-cbc-lmk", "aes-cbc-tcw"])
def test_lmk_and_tcw_have_no_bulk_path(text):
    spec = parse_cipher_spec(text)
    key = KeyMaterial(bytes(spec.valid_key_sizes[0]))
    with pytest.raises(CipherSpecError, match="no bulk path"):
        make_transform(spec, key, impl="bulk")
    assert isinstance(make_transform(spec, key), ReferenceTransform)


def test_auto_is_bulk_for_derivable_specs():
    transform = make_transform(parse_cipher_spec("aes-xts-plain64"), KeyMaterial(bytes(64)))
    assert isinstance(transform, BulkTransform)


def test_wiped_transform_refuses_to_convert():
    transform = make_transform(parse_cipher_spec("aes-xts-plain64"), KeyMaterial(os.urandom(64)))
    transform.wipe()
    with pytest.raises(KeyNotSet):
        transform.encrypt(bytes(512), 0)


def test_transform_keeps_its_own_copy_of_the_key():
    key = KeyMaterial(os.urandom(64))
    transform = make_transform(parse_cipher_spec("aes-xts-plain64"), key)
    before = transform.encrypt(bytes(512), 0)
    key.wipe()
    assert transform.encrypt(bytes(512), 0) == before


def test_empty_request_returns_empty_bytes():
    transform = make_transform(parse_cipher_spec("aes-xts-plain64"), KeyMaterial(bytes(range(64))))
    assert transform.encrypt(b"", 0) == b""


def test_cipher_null_is_the_identity_with_the_empty_key():
    transform = make_transform(parse_cipher_spec("cipher_null-ecb"), KeyMaterial.from_hex("-"))
    data = os.urandom(2048)
    assert transform.encrypt(data, 0) == data


def test_properties_expose_geometry():
    spec = parse_cipher_spec("aes-xts-plain64")
    transform = make_transform(spec, KeyMaterial(bytes(range(64))), sector_size=4096)
    assert (transform.spec, transform.sector_size, transform.sector_shift) == (spec, 4096, 3)
