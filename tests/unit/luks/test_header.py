"""Strict parsing: corrupt copies, hostile JSON, refused features and costs, nothing written."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.crypto.keys import KeyMaterial
from app.luks import af
from app.luks.device import (
    FormatOptions,
    PbkdfOptions,
    add_key,
    format_device,
    table_line,
    unlock,
)
from app.luks.errors import LuksError, NotLuks
from app.luks.header import read_header
from app.luks.kdf import Kdf, KdfCeiling
from app.storage.file import FileStore
from tests import cryptsetup

CEILING = KdfCeiling()
PASSPHRASE = b"pass"
CHEAP = PbkdfOptions("argon2id", iterations=4, memory_kib=32768, parallel=1)
HDR = 16384


def store(path: Path) -> FileStore:
    return FileStore(path, path.stat().st_size)


@pytest.fixture(scope="module")
def formatted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = cryptsetup.image(tmp_path_factory.mktemp("luks") / "template.img")
    format_device(store(path), PASSPHRASE, FormatOptions(pbkdf=CHEAP), CEILING)
    return path


@pytest.fixture
def luks2(formatted: Path, tmp_path: Path) -> Path:
    """A fresh copy of one LUKS2 image (formatting costs a PBKDF run)."""
    path = tmp_path / "disk.img"
    shutil.copyfile(formatted, path)
    return path


def flip(path: Path, offset: int) -> None:
    with path.open("r+b") as file:
        file.seek(offset)
        byte = file.read(1)
        file.seek(offset)
        file.write(bytes([byte[0] ^ 0x5A]))


def rewrite_json(
    path: Path, edit: Callable[[dict[str, Any]], Any] | None, text: bytes | None = None
) -> None:
    """Both copies carry ``text`` (or the edited document) with valid checksums: only the
    JSON checks can refuse it. The checksum is computed here independently of app.luks."""
    raw = bytearray(path.read_bytes()[: 2 * HDR])
    if text is None:
        document = json.loads(raw[4096:HDR].split(b"\0", 1)[0])
        assert edit is not None
        edit(document)
        text = json.dumps(document).encode()
    for base in (0, HDR):
        copy = raw[base : base + HDR]
        copy[4096:] = text + bytes(HDR - 4096 - len(text))
        copy[448:512] = bytes(64)
        copy[448:480] = hashlib.sha256(copy).digest()
        raw[base : base + HDR] = copy
    with path.open("r+b") as file:
        file.write(raw)


def test_the_af_split_merges_back_and_needs_every_stripe() -> None:
    key = bytes(range(64))
    material = af.split(key, 4000, "sha256")
    assert len(material) == 64 * 4000
    assert af.merge(material, 64, 4000, "sha256") == key
    material[1000] ^= 1
    assert af.merge(material, 64, 4000, "sha256") != key


@pytest.mark.parametrize("offset", [*range(0, HDR, 409), 6, 8, 16, 448, 4096, 4100])
def test_any_corrupt_byte_of_the_primary_falls_back_to_the_secondary(
    luks2: Path, offset: int
) -> None:
    flip(luks2, offset)
    header = read_header(store(luks2), CEILING)
    assert header.copy == "secondary"
    assert 0 in header.keyslots


def test_a_key_unlocks_through_the_secondary_copy(luks2: Path) -> None:
    flip(luks2, 5000)
    _, key, _ = unlock(store(luks2), PASSPHRASE, CEILING)
    assert len(key) == 64


def test_both_copies_corrupt_is_a_clear_error_and_nothing_is_written(luks2: Path) -> None:
    flip(luks2, 5000)
    flip(luks2, HDR + 5000)
    before = luks2.read_bytes()
    with pytest.raises(LuksError, match="checksum"):
        add_key(store(luks2), PASSPHRASE, b"other", CHEAP, CEILING)
    assert luks2.read_bytes() == before


def test_a_device_without_a_header_is_not_luks(tmp_path: Path) -> None:
    path = cryptsetup.image(tmp_path / "blank.img")
    with pytest.raises(NotLuks):
        read_header(store(path), CEILING)


def deep(levels: int) -> bytes:
    return b'{"keyslots":' + b"[" * levels + b"]" * levels + b"}"


HOSTILE: dict[str, bytes] = {
    "duplicate key": b'{"keyslots":{},"keyslots":{}}',
    "not json": b"{keyslots",
    "not an object": b"[1,2]",
    "nests too deeply": deep(100_00 // 2),
    "NaN": b'{"keyslots": NaN}',
}


@pytest.mark.parametrize("text", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_json_text_is_refused(luks2: Path, text: bytes) -> None:
    rewrite_json(luks2, None, text)
    with pytest.raises(LuksError):
        read_header(store(luks2), CEILING)


def test_a_json_area_without_its_terminator_is_refused(luks2: Path) -> None:
    rewrite_json(luks2, None, b"{" + b" " * (HDR - 4096 - 2) + b"}")
    with pytest.raises(LuksError, match="NUL-terminated"):
        read_header(store(luks2), CEILING)


def set_path(document: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split("/")
    for part in parents:
        document = document[part]
    if value is KeyError:
        del document[last]
    else:
        document[last] = value


EDITS: dict[str, tuple[str, Any, str]] = {
    "requirement flag": (
        "config/requirements",
        {"mandatory": ["online-reencrypt-v2"]},
        "requirement",
    ),
    "integrity segment": ("segments/0/integrity", {"type": "hmac(sha256)"}, "integrity"),
    "reencrypt keyslot": ("keyslots/0/type", "reencrypt", "reencryption"),
    "number as a number": ("segments/0/offset", 16777216, "decimal string"),
    "negative number": ("segments/0/offset", "-1", "decimal string"),
    "area over the header": ("keyslots/0/area/offset", "0", "outside the keyslots area"),
    "bool for an int": ("keyslots/0/key_size", True, "integer"),
    "memory over the ceiling": ("keyslots/0/kdf/memory", 8 << 20, "memory"),
    "threads over the ceiling": ("keyslots/0/kdf/cpus", 1000, "threads"),
    "time over the ceiling": ("keyslots/0/kdf/time", 1 << 20, "time"),
    "digest iterations over the ceiling": ("digests/0/iterations", 1 << 31, "iterations"),
    "unknown kdf": ("keyslots/0/kdf/type", "scrypt", "KDF"),
    "missing digest": ("digests/0", KeyError, "digest"),
    "stripes": ("keyslots/0/af/stripes", 1, "stripes"),
    "salt not base64": ("keyslots/0/kdf/salt", "!!", "base64"),
    "unknown cipher": ("segments/0/encryption", "rot13-ecb-plain", "cipher"),
    "unknown field": ("config/surprise", 1, "unsupported field"),
    "second segment": ("segments/1", {"type": "crypt"}, "one data segment"),
    "digest names a missing keyslot": ("digests/0/keyslots", ["7"], "does not exist"),
}


@pytest.mark.parametrize(("path", "value", "message"), list(EDITS.values()), ids=list(EDITS))
def test_a_refused_field_is_a_clear_error_and_nothing_is_written(
    luks2: Path, path: str, value: Any, message: str
) -> None:
    rewrite_json(luks2, lambda document: set_path(document, path, value))
    before = luks2.read_bytes()
    with pytest.raises(LuksError, match=message):
        unlock(store(luks2), PASSPHRASE, CEILING)
    with pytest.raises(LuksError, match=message):
        add_key(store(luks2), PASSPHRASE, b"x", CHEAP, CEILING)
    assert luks2.read_bytes() == before


def test_a_cost_over_the_ceiling_is_refused_before_any_work() -> None:
    kdf = Kdf("argon2id", b"s" * 32, time=4, memory_kib=2 << 20, parallel=1)
    with pytest.raises(LuksError, match="REQCRYPT_LUKS_MAX_PBKDF_MEMORY_KIB"):
        kdf.derive(b"pass", 32, KdfCeiling(memory_kib=1 << 20))


def test_format_refuses_a_cost_over_the_ceiling_and_writes_nothing(tmp_path: Path) -> None:
    path = cryptsetup.image(tmp_path / "disk.img")
    options = FormatOptions(pbkdf=PbkdfOptions("pbkdf2", iterations=10_000))
    with pytest.raises(LuksError, match="iterations"):
        format_device(store(path), PASSPHRASE, options, KdfCeiling(iterations=5000))
    assert path.read_bytes() == bytes(32 << 20)


def test_persistent_flags_become_crypt_options_as_cryptsetup_open_maps_them(luks2: Path) -> None:
    rewrite_json(
        luks2,
        lambda document: set_path(
            document, "config/flags", ["no-read-workqueue", "allow-discards"]
        ),
    )
    header, key, _ = unlock(store(luks2), PASSPHRASE, CEILING)
    line = table_line(header, KeyMaterial(key), "sdb", 32 << 20, allow_discards=True)
    assert line == (
        f"0 32768 crypt aes-xts-plain64 {key.hex()} 0 sdb 32768 2 allow_discards no_read_workqueue"
    )


def test_a_primary_naming_another_valid_header_size_still_finds_the_secondary(
    luks2: Path,
) -> None:
    with luks2.open("r+b") as file:
        file.seek(8)
        file.write((32768).to_bytes(8, "big"))
    assert read_header(store(luks2), CEILING).copy == "secondary"


def test_a_kept_unbound_keyslot_is_never_overwritten_by_a_new_one(luks2: Path) -> None:
    def unbound(document: dict[str, Any]) -> None:
        slot = json.loads(json.dumps(document["keyslots"]["0"]))
        slot["area"]["offset"] = str(32768 + 258048)
        document["keyslots"]["1"] = slot
        digest = dict(document["digests"]["0"], keyslots=["1"], segments=[])
        document["digests"]["1"] = digest

    rewrite_json(luks2, unbound)
    header, slot = add_key(store(luks2), PASSPHRASE, b"new", CHEAP, CEILING)
    assert slot == 2
    assert header.keyslots[2].offset == 32768 + 2 * 258048
    assert unlock(store(luks2), b"new", CEILING)[2] == 2
    assert read_header(store(luks2), CEILING).metadata["keyslots"]["1"]["area"]["offset"] == str(
        32768 + 258048
    )
