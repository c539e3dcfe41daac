"""KeyMaterial never shows its bytes; wrap/unwrap binds a key to one volume."""

from __future__ import annotations

import os
import pickle

import pytest

from app.crypto.keys import KeyMaterial, KeyUnwrapError, unwrap_key, wrap_key
from app.crypto.spec import parse_cipher_spec
from app.crypto.transform import make_transform
from app.errors import CipherSpecError

SECRET_HEX = "deadbeef" * 16
MASTER = bytes(range(32))


def test_repr_and_str_show_length_only():
    key = KeyMaterial.from_hex(SECRET_HEX)
    for text in (repr(key), str(key), f"{key}", f"{[key]}"):
        assert "deadbeef" not in text.lower()
    assert repr(key) == "<KeyMaterial 64 bytes>"


def test_hex_shows_the_key_on_explicit_request():
    assert KeyMaterial.from_hex(SECRET_HEX).hex() == SECRET_HEX


def test_dash_is_the_empty_key():
    key = KeyMaterial.from_hex("-")
    assert len(key) == 0
    assert key.hex() == "-"


def test_wipe_zeroes_and_empties_the_key():
    key = KeyMaterial.from_hex(SECRET_HEX)
    buffer = key._data
    key.wipe()
    assert len(key) == 0
    assert not any(buffer)


def test_equality_compares_content():
    assert KeyMaterial.from_hex(SECRET_HEX) == KeyMaterial.from_hex(SECRET_HEX)
    assert KeyMaterial.from_hex(SECRET_HEX) != KeyMaterial.from_hex("00" * 64)


def test_key_material_is_not_hashable_or_picklable():
    key = KeyMaterial.from_hex(SECRET_HEX)
    with pytest.raises(TypeError):
        hash(key)
    with pytest.raises(TypeError):
        pickle.dumps(key)


@pytest.mark.parametrize("text", ["deadbeefz" + "0" * 55, "abc", "dead beef"])
def test_from_hex_error_does_not_echo_the_text(text):
    with pytest.raises(CipherSpecError) as caught:
        KeyMaterial.from_hex(text)
    assert "dead" not in str(caught.value)
    assert "abc" not in str(caught.value)


def test_wrong_key_size_error_does_not_leak_key_bytes():
    key = KeyMaterial.from_hex("deadbeef" * 4)
    with pytest.raises(CipherSpecError) as caught:
        make_transform(parse_cipher_spec("aes-xts-plain64"), key)
    assert "deadbeef" not in str(caught.value)
    assert "32 hex digits" in str(caught.value)


def test_wrap_then_unwrap_returns_the_key():
    key = KeyMaterial(os.urandom(64))
    blob = wrap_key(MASTER, key, b"volume:v1")
    assert unwrap_key(MASTER, blob, b"volume:v1") == key


def test_wrap_uses_a_fresh_nonce_each_time():
    key = KeyMaterial(os.urandom(32))
    assert wrap_key(MASTER, key, b"v") != wrap_key(MASTER, key, b"v")


def test_unwrap_with_wrong_aad_fails_without_detail():
    key = KeyMaterial.from_hex(SECRET_HEX)
    blob = wrap_key(MASTER, key, b"volume:v1")
    with pytest.raises(KeyUnwrapError) as caught:
        unwrap_key(MASTER, blob, b"volume:v2")
    assert "deadbeef" not in str(caught.value)


def test_unwrap_with_wrong_master_fails():
    blob = wrap_key(MASTER, KeyMaterial(os.urandom(32)), b"v")
    with pytest.raises(KeyUnwrapError):
        unwrap_key(bytes(32), blob, b"v")


def test_unwrap_of_a_tampered_blob_fails():
    blob = bytearray(wrap_key(MASTER, KeyMaterial(os.urandom(32)), b"v"))
    blob[-1] ^= 1
    with pytest.raises(KeyUnwrapError):
        unwrap_key(MASTER, bytes(blob), b"v")


def test_master_key_must_be_32_bytes():
    with pytest.raises(CipherSpecError, match="master key must be 32 bytes"):
        wrap_key(b"short", KeyMaterial(b"k" * 16), b"v")
