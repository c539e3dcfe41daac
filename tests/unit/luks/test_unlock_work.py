"""One ceiling on all the key derivation of one unlock, counted from the header before any runs.

A wrong passphrase tries every keyslot and the digest after each: a header of 32 keyslots,
each within the per-keyslot ceilings, would cost an hour per request.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from app.luks import device
from app.luks.device import (
    FormatOptions,
    PbkdfOptions,
    add_key,
    check_unlock_work,
    format_device,
    kill_slot,
    unlock,
)
from app.luks.errors import LuksError
from app.luks.header import AF_STRIPES, Digest, Keyslot, read_header
from app.luks.kdf import Kdf, KdfCeiling, pbkdf2, pbkdf2_work
from app.storage.file import FileStore
from tests import cryptsetup

PASSPHRASE = b"pass"
CHEAP = PbkdfOptions("pbkdf2", iterations=1000)
AREA = 258048
"""A LUKS2 keyslot area of a 512-bit key, 4000 stripes, 4 KiB aligned (as cryptsetup's)."""
COSTLY = {"type": "argon2id", "time": 8, "memory": 1 << 20, "cpus": 4, "salt": "c2FsdHNhbHQ="}
"""Within the default per-keyslot ceilings (1 GiB, 64 passes, 16 threads): 8 GiB-passes."""


def store(path: Path) -> FileStore:
    return FileStore(path, path.stat().st_size)


def formatted(tmp_path: Path) -> Path:
    path = cryptsetup.image(tmp_path / "disk.img")
    format_device(store(path), PASSPHRASE, FormatOptions(pbkdf=CHEAP), KdfCeiling())
    return path


def add_slots(path: Path, kdf: dict[str, Any], count: int) -> None:
    """``count`` more keyslots of ``kdf`` bound to the volume key's digest, each in its own
    area: a header whose every slot passes the parser, without deriving any of them."""
    disk = store(path)
    header = read_header(disk, KdfCeiling())
    model = header.metadata["keyslots"]["0"]
    for number in range(1, count + 1):
        slot = copy.deepcopy(model)
        slot["area"]["offset"] = str(int(model["area"]["offset"]) + number * AREA)
        slot["kdf"] = kdf
        header.metadata["keyslots"][str(number)] = slot
        header.metadata["digests"]["0"]["keyslots"].append(str(number))
    device.write_header(disk, header)


def keyslot(kdf: Kdf, key_bytes: int = 64) -> Keyslot:
    return Keyslot(key_bytes, kdf, 32768, AREA, "aes-xts-plain64", key_bytes, AF_STRIPES, "sha256")


@pytest.fixture
def derivations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every keyslot and digest derivation started, by kind."""
    started: list[str] = []
    derive = Kdf.derive
    digest = pbkdf2

    def counted_derive(self: Kdf, *args: Any) -> bytearray:
        started.append(self.type)
        return derive(self, *args)

    def counted_digest(*args: Any) -> bytes:
        started.append("digest")
        return digest(*args)

    monkeypatch.setattr(Kdf, "derive", counted_derive)
    monkeypatch.setattr(device, "pbkdf2", counted_digest)
    return started


def no_derivation(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on, any keyslot or digest derivation fails the test at once (instead of
    costing seconds)."""

    def refused(*args: Any) -> bytearray:
        raise AssertionError("a derivation ran")

    monkeypatch.setattr(Kdf, "derive", refused)
    monkeypatch.setattr(device, "pbkdf2", refused)


def test_pbkdf2_costs_an_hmac_per_iteration_per_block_of_the_hash() -> None:
    assert pbkdf2_work("sha256", 1000, 32) == 1000
    assert pbkdf2_work("sha256", 1000, 64) == 2000  # a 512-bit key: two SHA-256 blocks
    assert pbkdf2_work("sha1", 1000, 64) == 4000  # four 20-byte blocks
    assert pbkdf2_work("sha512", 1000, 64) == 2000  # one block, each HMAC twice the work


def test_argon2_costs_memory_times_passes_whatever_its_threads() -> None:
    one = Kdf("argon2id", b"s" * 16, time=4, memory_kib=1 << 20, parallel=1)
    four = Kdf("argon2id", b"s" * 16, time=4, memory_kib=1 << 20, parallel=4)
    assert one.work(64) == four.work(64) == 4 * (1 << 20) * 4


@pytest.mark.parametrize(
    ("slots", "kdf", "digest_iterations"),
    [
        # cryptsetup 2.6 luksFormat: argon2id, 1 GiB, 4 threads, 4+ passes for its 2 s
        (1, Kdf("argon2id", b"s" * 32, time=4, memory_kib=1 << 20, parallel=4), 100_000),
        (4, Kdf("argon2id", b"s" * 32, time=10, memory_kib=1 << 20, parallel=4), 300_000),
        # cryptsetup 2.6 luksFormat --type luks1: PBKDF2-SHA256 of 1-2 M iterations
        (8, Kdf("pbkdf2", b"s" * 32, hash="sha256", iterations=2_000_000), 250_000),
    ],
)
def test_headers_cryptsetup_makes_by_default_are_within_the_default_ceiling(
    slots: int, kdf: Kdf, digest_iterations: int
) -> None:
    digest = Digest("sha256", digest_iterations, b"s" * 32, bytes(32))
    check_unlock_work([keyslot(kdf)] * slots, digest, KdfCeiling())


def test_many_keyslots_within_the_per_keyslot_ceilings_are_refused_before_any_derivation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = formatted(tmp_path)
    add_slots(path, COSTLY, 31)
    no_derivation(monkeypatch)
    with pytest.raises(LuksError, match="REQCRYPT_LUKS_MAX_UNLOCK_WORK") as refused:
        unlock(store(path), PASSPHRASE, KdfCeiling())
    slot_zero = pbkdf2_work("sha256", 1000, 64)
    digest = pbkdf2_work("sha256", 1000, 32)
    total = slot_zero + 31 * (1 << 20) * 8 * 4 + 32 * digest
    assert f"{total:,}" in refused.value.detail
    assert "200,000,000" in refused.value.detail


def test_adding_a_keyslot_is_refused_when_the_header_would_no_longer_open(
    tmp_path: Path, derivations: list[str]
) -> None:
    path = formatted(tmp_path)
    before = path.read_bytes()
    one_slot = pbkdf2_work("sha256", 1000, 64) + pbkdf2_work("sha256", 1000, 32)
    derivations.clear()
    with pytest.raises(LuksError, match="REQCRYPT_LUKS_MAX_UNLOCK_WORK"):
        add_key(store(path), PASSPHRASE, b"new", CHEAP, KdfCeiling(unlock_work=one_slot))
    assert derivations == ["pbkdf2", "digest"]  # the unlock of slot 0, no new slot
    assert path.read_bytes() == before


def test_formatting_is_refused_when_the_header_would_not_open_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = cryptsetup.image(tmp_path / "disk.img")
    no_derivation(monkeypatch)
    with pytest.raises(LuksError, match="REQCRYPT_LUKS_MAX_UNLOCK_WORK"):
        format_device(
            store(path), PASSPHRASE, FormatOptions(pbkdf=CHEAP), KdfCeiling(unlock_work=2000)
        )
    assert path.read_bytes() == bytes(32 << 20)


def test_killing_a_keyslot_counts_only_the_keyslots_that_remain(tmp_path: Path) -> None:
    path = formatted(tmp_path)
    add_slots(path, COSTLY, 1)
    ceiling = KdfCeiling(unlock_work=1_000_000)
    with pytest.raises(LuksError, match="REQCRYPT_LUKS_MAX_UNLOCK_WORK"):
        unlock(store(path), PASSPHRASE, ceiling)
    kill_slot(store(path), 1, PASSPHRASE, ceiling, force=False)
    assert unlock(store(path), PASSPHRASE, ceiling)[2] == 0
