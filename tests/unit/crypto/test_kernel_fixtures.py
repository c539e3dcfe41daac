"""reqcrypt's ciphertext equals what the real Linux dm-crypt wrote, hash for hash.

``vectors/kernel_fixtures.json`` holds SHA-256 hashes of backing images written by
a real kernel (dmsetup in a qemu-booted Debian kernel) plus the exact table and
the recipes of plaintext, keys and initial backing image. Here we rebuild the same
backing image with ``app.crypto`` alone (no oracle, no kernel) and compare hashes.
How the fixtures were made: docs/kernel-fixtures.md; regenerate with
scripts/make-kernel-fixtures.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import pytest

from app.crypto.keys import KeyMaterial
from app.crypto.spec import parse_cipher_spec
from app.crypto.transform import Impl, make_transform
from app.errors import CipherSpecError
from tests.support.vectors import CASES, FIXTURES, stream

DATA_DEPENDENT_IV = ("lmk", "tcw")
"""IV modes without a bulk path: BulkTransform refuses them, ``auto`` uses the reference."""


def sha256(data: bytes | bytearray) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class CryptLine:
    """One ``crypt`` table line, in bytes where the kernel works in sectors."""

    start: int
    length: int
    cipher: str
    key_hex: str
    iv_offset: int
    offset: int
    sector_size: int
    iv_large_sectors: bool


def parse_line(text: str, keys: list[dict[str, Any]]) -> CryptLine:
    """``start length crypt cipher key iv_offset {dev} offset [n feature...]``."""
    for index, recipe in enumerate(keys):
        key_hex = stream(recipe["seed"], recipe["size"]).hex() if recipe["size"] else "-"
        text = text.replace(f"{{key{index}}}", key_hex)
    words = text.split()
    assert words[2] == "crypt"
    assert words[6] == "{dev}"
    sector_size, large = 512, False
    if len(words) > 8:
        features = words[9:]
        assert int(words[8]) == len(features)
        for feature in features:
            if feature == "iv_large_sectors":
                large = True
            elif feature.startswith("sector_size:"):
                sector_size = int(feature.split(":", 1)[1])
            else:  # pragma: no cover - the fixtures use only these two
                raise AssertionError(f"feature {feature} is not modelled by this test")
    return CryptLine(
        start=int(words[0]) * 512,
        length=int(words[1]) * 512,
        cipher=words[3],
        key_hex=words[4],
        iv_offset=int(words[5]),
        offset=int(words[7]) * 512,
        sector_size=sector_size,
        iv_large_sectors=large,
    )


def impls_for(cipher: str) -> tuple[Impl, ...]:
    if parse_cipher_spec(cipher).ivmode in DATA_DEPENDENT_IV:
        return ("reference", "auto")
    return ("reference", "bulk")


def build_image(
    case: dict[str, Any], impl: Impl, *, iv_offset_delta: int = 0
) -> tuple[bytearray, list[str]]:
    """The backing image after writing the plaintext through the case's table.

    Also decrypts each line's ciphertext back. Returns the image and per-line hashes.
    """
    plaintext = stream(case["plaintext"]["seed"], case["plaintext"]["size"])
    init = case.get("backing_init")
    image = bytearray(stream(init["seed"], init["size"]) if init else b"")
    image.extend(bytes(case["backing_size"] - len(image)))
    line_hashes = []
    for text in case["table"]:
        line = parse_line(text, case["keys"])
        transform = make_transform(
            parse_cipher_spec(line.cipher),
            KeyMaterial.from_hex(line.key_hex),
            sector_size=line.sector_size,
            iv_offset=(line.iv_offset + iv_offset_delta) % (1 << 64),
            iv_large_sectors=line.iv_large_sectors,
            impl=impl,
        )
        chunk = plaintext[line.start : line.start + line.length]
        ciphertext = transform.encrypt(chunk, 0)
        assert len(ciphertext) == line.length
        assert transform.decrypt(ciphertext, 0) == chunk
        image[line.offset : line.offset + line.length] = ciphertext
        line_hashes.append(sha256(ciphertext))
    return image, line_hashes


def test_fixtures_were_made_by_a_kernel():
    oracle = FIXTURES["oracle"]
    assert oracle["guest_uname_r"] == [oracle["kver"]]
    assert len(CASES) == len(FIXTURES["cases"]) >= 40
    for case in CASES.values():
        assert case["kernel"]["decrypt_roundtrip"] == "ok"
        assert "readback=ok" in case["kernel"]["oracle_detail"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_plaintext_recipe_matches_what_the_kernel_was_given(name):
    case = CASES[name]
    plaintext = stream(case["plaintext"]["seed"], case["plaintext"]["size"])
    assert sha256(plaintext) == case["kernel"]["plaintext_sha256"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_ciphertext_matches_kernel_dm_crypt(name, aes_path):
    case = CASES[name]
    expected = case["kernel"]
    for impl in impls_for(parse_line(case["table"][0], case["keys"]).cipher):
        image, line_hashes = build_image(case, impl)
        assert line_hashes == expected["ciphertext_sha256"], impl
        assert sha256(image) == expected["backing_sha256"], impl


@pytest.mark.parametrize("name", sorted(n for n in CASES if "lmk" in n or "tcw" in n))
def test_data_dependent_iv_modes_have_no_bulk_path(name):
    case = CASES[name]
    with pytest.raises(CipherSpecError, match="no bulk path"):
        build_image(case, "bulk")


@pytest.mark.parametrize(
    "name",
    ["aes-xts-plain64-k64", "aes-cbc-plain-ivoffset", "aes-cbc-essiv-sha256", "aes-cbc-lmk-v2"],
)
@pytest.mark.parametrize("delta", [1, -1])
def test_negative_control_iv_offset_off_by_one_is_caught(name, delta):
    """The comparison can fail: the same case with iv_offset +/- 1 must not match."""
    case = CASES[name]
    image, line_hashes = build_image(case, "reference", iv_offset_delta=delta)
    assert line_hashes != case["kernel"]["ciphertext_sha256"]
    assert sha256(image) != case["kernel"]["backing_sha256"]
