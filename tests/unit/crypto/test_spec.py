"""parse_cipher_spec: dm-crypt's cipher field grammar, printing, refusals and key sizes."""

from __future__ import annotations

import pytest

from app.crypto.spec import parse_cipher_spec
from app.errors import CipherSpecError, InvalidInput


@pytest.mark.parametrize(
    ("text", "cipher", "chainmode", "ivmode", "ivopts", "keycount", "capi"),
    [
        ("aes-xts-plain64", "aes", "xts", "plain64", None, 1, False),
        ("aes-cbc-essiv:sha256", "aes", "cbc", "essiv", "sha256", 1, False),
        ("aes:64-cbc-lmk", "aes", "cbc", "lmk", None, 64, False),
        ("aes-cbc-tcw", "aes", "cbc", "tcw", None, 1, False),
        ("aes-ctr-plain64", "aes", "ctr", "plain64", None, 1, False),
        ("aes-cbc-null", "aes", "cbc", "null", None, 1, False),
        ("aes-ecb", "aes", "ecb", None, None, 1, False),
        ("aes", "aes", "cbc", "plain", None, 1, False),
        ("aes-plain", "aes", "cbc", "plain", None, 1, False),
        ("aes-cbc-essiv:sha3-256", "aes", "cbc", "essiv", "sha3-256", 1, False),
        ("capi:xts(aes)-plain64", "aes", "xts", "plain64", None, 1, True),
        ("capi:cbc(aes)-essiv:sha256", "aes", "cbc", "essiv", "sha256", 1, True),
        ("capi:ecb(aes)", "aes", "ecb", None, None, 1, True),
        ("capi:cbc(aes)-lmk", "aes", "cbc", "lmk", None, 64, True),
        ("cipher_null-ecb", "cipher_null", "ecb", None, None, 1, False),
        ("camellia-xts-plain64", "camellia", "xts", "plain64", None, 1, False),
        ("des3_ede-cbc-plain64", "des3_ede", "cbc", "plain64", None, 1, False),
    ],
)
def test_parse_splits_the_kernel_fields(text, cipher, chainmode, ivmode, ivopts, keycount, capi):
    spec = parse_cipher_spec(text)
    assert (spec.cipher, spec.chainmode, spec.ivmode, spec.ivopts) == (
        cipher,
        chainmode,
        ivmode,
        ivopts,
    )
    assert (spec.keycount, spec.capi) == (keycount, capi)


@pytest.mark.parametrize(
    "text", ["aes-xts-plain64", "capi:xts(aes)-plain64", "aes", "aes:64-cbc-lmk"]
)
def test_format_prints_the_cipher_string_as_given(text):
    assert parse_cipher_spec(text).format() == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("aes-cbc-foo", "unknown IV mode 'foo'"),
        ("aes-cbc-random", "IV mode random is not supported: ciphertext would not be reproducible"),
        ("capi:gcm(aes)-random", "integrity/AEAD modes need dm-integrity"),
        ("capi:authenc(hmac(sha256),xts(aes))-plain64", "integrity/AEAD modes need dm-integrity"),
        ("capi:rfc4106(gcm(aes))-plain64", "integrity/AEAD modes need dm-integrity"),
        ("twofish-xts-plain64", "cipher 'twofish' is not available"),
        ("serpent-cbc-essiv:sha256", "cipher 'serpent' is not available"),
        ("rot13-cbc-plain", "unknown cipher 'rot13'"),
        ("aes-cbc", "needs an IV mode"),
        ("aes-ecb-plain", "ecb takes no IV mode"),
        ("aes:3-cbc-plain", "power of two"),
        ("aes:x-cbc-plain", "bad cipher key count"),
        ("aes-cbc-essiv", "digest algorithm missing"),
        ("aes-cbc-essiv:sha1", "not a valid aes key size"),
        ("aes-cbc-essiv:whirlpool", "unknown ESSIV hash"),
        ("aes-lrw-benbi", "chain mode 'lrw' is not supported"),
        ("des3_ede-xts-plain64", "xts needs a 16-byte block cipher"),
        ("aes-cbc-elephant:4", "elephant"),
        ("aes-cbc-plain:opt", "takes no options"),
        ("cbc(aes)-plain64", "capi:"),
        ("", "empty"),
        ("aes-xts-plain64 ", "whitespace"),
        ("aes-xts-lmk", "only with cbc"),
        ("aes-xts-eboiv", "only with cbc"),
    ],
)
def test_refused_spec_raises_cipher_spec_error_with_reason(text, message):
    with pytest.raises(CipherSpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_cipher_spec(text)


def test_cipher_spec_error_is_invalid_input():
    with pytest.raises(InvalidInput):
        parse_cipher_spec("aes-cbc-foo")


@pytest.mark.parametrize(
    ("text", "sizes"),
    [
        ("aes-xts-plain64", (32, 48, 64)),
        ("aes-cbc-essiv:sha256", (16, 24, 32)),
        ("aes:2-cbc-plain64", (32, 48, 64)),
        ("aes-cbc-tcw", (48, 56, 64)),
        ("aes:64-cbc-lmk", (1024, 1040, 1536, 1560, 2048, 2080)),
        ("aes-cbc-lmk", (16, 24, 32)),
        ("cipher_null-ecb", (0,)),
        ("sm4-xts-plain64", (32,)),
    ],
)
def test_valid_key_sizes_follow_the_kernel_key_split(text, sizes):
    assert parse_cipher_spec(text).valid_key_sizes == sizes


def test_check_key_message_states_lengths_only():
    with pytest.raises(CipherSpecError) as caught:
        parse_cipher_spec("aes-xts-plain64").check_key(b"\xab" * 31)
    assert str(caught.value) == "key is 62 hex digits; aes-xts-plain64 needs 64 or 96 or 128"
    assert "ab" not in str(caught.value)


def test_check_key_accepts_a_valid_length():
    parse_cipher_spec("aes-xts-plain64").check_key(bytes(64))


@pytest.mark.parametrize(
    ("text", "derivable"),
    [
        ("aes-xts-plain64", True),
        ("aes-cbc-essiv:sha256", True),
        ("aes-cbc-eboiv", True),
        ("aes-ctr-plain64", True),
        ("aes-ecb", True),
        ("aes-cbc-benbi", True),
        ("aes:64-cbc-lmk", False),
        ("aes-cbc-lmk", False),
        ("aes-cbc-tcw", False),
        ("aes:2-xts-plain64", False),
    ],
)
def test_bulk_derivable_only_when_one_start_sector_fixes_every_iv(text, derivable):
    assert parse_cipher_spec(text).bulk_derivable is derivable


@pytest.mark.parametrize(
    ("text", "iv_size", "block_size"),
    [("aes-xts-plain64", 16, 16), ("aes-ecb", 0, 16), ("des3_ede-cbc-plain", 8, 8)],
)
def test_iv_and_block_sizes(text, iv_size, block_size):
    spec = parse_cipher_spec(text)
    assert (spec.iv_size, spec.block_size) == (iv_size, block_size)
