"""Both directions against cryptsetup 2.6: its images open here, ours open there."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.luks.device import (
    FormatOptions,
    PbkdfOptions,
    add_key,
    format_device,
    kill_slot,
    unlock,
)
from app.luks.errors import NoKeyAvailable
from app.luks.kdf import KdfCeiling
from app.storage.file import FileStore
from tests import cryptsetup

CEILING = KdfCeiling()
PASSPHRASE = b"correct horse battery staple"
CHEAP = {
    "argon2id": PbkdfOptions("argon2id", iterations=4, memory_kib=32768, parallel=1),
    "argon2i": PbkdfOptions("argon2i", iterations=4, memory_kib=32768, parallel=1),
    "pbkdf2": PbkdfOptions("pbkdf2", iterations=1000),
}
CASES = [
    ("luks1", "pbkdf2", 512),
    ("luks2", "argon2id", 512),
    ("luks2", "argon2id", 4096),
    ("luks2", "argon2i", 512),
    ("luks2", "pbkdf2", 4096),
]


def store(path: Path) -> FileStore:
    return FileStore(path, path.stat().st_size)


@pytest.mark.parametrize(("kind", "pbkdf", "sector_size"), CASES)
def test_a_cryptsetup_image_unlocks_to_the_key_cryptsetup_dumps(
    tmp_path: Path, kind: str, pbkdf: str, sector_size: int
) -> None:
    path = cryptsetup.image(tmp_path / "disk.img")
    cryptsetup.luks_format(path, PASSPHRASE, kind=kind, pbkdf=pbkdf, sector_size=sector_size)
    header, key, slot = unlock(store(path), PASSPHRASE, CEILING)
    assert (bytes(key), slot) == (cryptsetup.volume_key(path, PASSPHRASE), 0)
    assert (header.version, header.sector_size) == (int(kind[-1]), sector_size)


@pytest.mark.parametrize(("kind", "pbkdf", "sector_size"), CASES)
def test_an_image_formatted_here_opens_in_cryptsetup_with_the_same_key(
    tmp_path: Path, kind: str, pbkdf: str, sector_size: int
) -> None:
    path = cryptsetup.image(tmp_path / "disk.img")
    options = FormatOptions(type=kind, sector_size=sector_size, pbkdf=CHEAP[pbkdf])  # type: ignore[arg-type]
    _, key = format_device(store(path), PASSPHRASE, options, CEILING)
    cryptsetup.run("luksDump", str(path))
    assert cryptsetup.opens(path, PASSPHRASE)
    assert cryptsetup.volume_key(path, PASSPHRASE) == key.to_bytes()


def formatted_by_cryptsetup(tmp_path: Path, kind: str, *, second: bool) -> tuple[Path, str]:
    """A cryptsetup image (cheapest PBKDF of its version), with slot 1 = b"second" if asked."""
    path = cryptsetup.image(tmp_path / "disk.img")
    pbkdf = "pbkdf2" if kind == "luks1" else "argon2id"
    cryptsetup.luks_format(path, PASSPHRASE, kind=kind, pbkdf=pbkdf)
    if second:
        cryptsetup.add_key(path, PASSPHRASE, b"second", pbkdf=pbkdf)
    return path, pbkdf


@pytest.mark.parametrize("kind", ["luks1", "luks2"])
def test_a_slot_cryptsetup_adds_unlocks_here(tmp_path: Path, kind: str) -> None:
    path, _ = formatted_by_cryptsetup(tmp_path, kind, second=True)
    _, key, slot = unlock(store(path), b"second", CEILING)
    assert (bytes(key), slot) == (cryptsetup.volume_key(path, PASSPHRASE), 1)


@pytest.mark.parametrize("kind", ["luks1", "luks2"])
def test_a_slot_added_here_unlocks_in_cryptsetup(tmp_path: Path, kind: str) -> None:
    path, pbkdf = formatted_by_cryptsetup(tmp_path, kind, second=False)
    _, slot = add_key(store(path), PASSPHRASE, b"second", CHEAP[pbkdf], CEILING)
    assert slot == 1
    assert cryptsetup.opens(path, b"second")
    assert cryptsetup.volume_key(path, b"second") == cryptsetup.volume_key(path, PASSPHRASE)


@pytest.mark.parametrize("kind", ["luks1", "luks2"])
def test_a_killed_slot_no_longer_opens_anywhere(tmp_path: Path, kind: str) -> None:
    path, _ = formatted_by_cryptsetup(tmp_path, kind, second=True)
    kill_slot(store(path), 0, b"second", CEILING, force=False)
    assert not cryptsetup.opens(path, PASSPHRASE)
    assert cryptsetup.opens(path, b"second")
    with pytest.raises(NoKeyAvailable):
        unlock(store(path), PASSPHRASE, CEILING)


def test_a_wrong_passphrase_is_refused_without_naming_a_slot(tmp_path: Path) -> None:
    path = cryptsetup.image(tmp_path / "disk.img")
    cryptsetup.luks_format(path, PASSPHRASE, kind="luks2", pbkdf="argon2id")
    cryptsetup.add_key(path, PASSPHRASE, b"second", pbkdf="argon2id")
    with pytest.raises(NoKeyAvailable) as caught:
        unlock(store(path), b"wrong", CEILING)
    assert caught.value.detail == "no keyslot opens with this passphrase"
