"""Published vectors (IEEE 1619, Linux testmgr, cryptsetup) hold on both transform paths
(and, for AES-CBC, on each bulk encryption path).

Sources are cited inside each JSON file under ``vectors/``.
"""

from __future__ import annotations

import hashlib

import pytest

from app.crypto.keys import KeyMaterial
from app.crypto.spec import parse_cipher_spec
from app.crypto.transform import make_transform
from tests.support.vectors import load_vectors

XTS = load_vectors("ieee1619_xts_aes128.json")
ESSIV = load_vectors("linux_testmgr_essiv_cbc_aes_sha256.json")
IV_GENERATORS = load_vectors("cryptsetup_iv_generators.json")


def _sector_prefix(plaintext: bytes) -> bytes:
    """Vectors shorter than a sector are the prefix of a sector (XTS blocks, CBC prefix)."""
    return plaintext.ljust(512, b"\0")


@pytest.mark.parametrize("vector", XTS["vectors"], ids=lambda v: v["name"])
def test_ieee1619_xts_vector_matches_aes_xts_plain64(vector, impl):
    key = KeyMaterial.from_hex(vector["key_hex_dmcrypt"])
    transform = make_transform(parse_cipher_spec(XTS["dm_crypt_cipher"]), key, impl=impl)
    plaintext = bytes.fromhex(vector["plaintext_hex"])
    expected = bytes.fromhex(vector["ciphertext_hex"])
    sector = vector["sector_dusn"]
    ciphertext = transform.encrypt(_sector_prefix(plaintext), sector)
    assert ciphertext[: len(expected)] == expected
    assert transform.decrypt(ciphertext, sector)[: len(plaintext)] == plaintext


@pytest.mark.parametrize("vector", ESSIV["vectors"], ids=lambda v: f"aes{v['key_bits']}-{v['len']}")
def test_linux_testmgr_essiv_vector_matches_aes_cbc_essiv_sha256(vector, impl, aes_path):
    key = KeyMaterial.from_hex(vector["key_hex"])
    transform = make_transform(parse_cipher_spec(ESSIV["dm_crypt_cipher"]), key, impl=impl)
    plaintext = bytes.fromhex(vector["plaintext_hex"])
    expected = bytes.fromhex(vector["ciphertext_hex"])
    assert vector["iv_input_hex"] == vector["sector"].to_bytes(16, "little").hex()
    ciphertext = transform.encrypt(_sector_prefix(plaintext), vector["sector"])
    assert ciphertext[: len(expected)] == expected


def _iv_generator_cases():
    for vector in IV_GENERATORS["vectors"]:
        for output in vector["outputs"]:
            label = f"{vector['cipher']}-{output['sector_size']}-{'large' if output['iv_large_sectors'] else 'small'}"
            yield pytest.param(vector, output, id=label)


@pytest.mark.parametrize(("vector", "output"), list(_iv_generator_cases()))
def test_cryptsetup_iv_generator_vector_matches(vector, output, impl, aes_path):
    transform = make_transform(
        parse_cipher_spec(vector["cipher"]),
        KeyMaterial.from_hex(vector["key_hex"]),
        sector_size=output["sector_size"],
        iv_offset=vector["iv_offset"],
        iv_large_sectors=output["iv_large_sectors"],
        impl=impl,
    )
    plaintext = bytes(vector["data_length"])
    assert hashlib.sha256(plaintext).hexdigest() == vector["plaintext_sha256"]
    ciphertext = transform.encrypt(plaintext, 0)
    assert hashlib.sha256(ciphertext).hexdigest() == output["ciphertext_sha256"]
    assert transform.decrypt(ciphertext, 0) == plaintext
