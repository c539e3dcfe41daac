"""Password-based key derivation of LUKS keyslots: PBKDF2 (LUKS1 and LUKS2), Argon2i/id (LUKS2).

A header names its own costs, so a hostile one could ask for terabytes of memory or
years of hashing: every derivation is checked against ``KdfCeiling`` first, before any
work, and refused as ``LuksError``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from cryptography.hazmat.primitives.kdf.argon2 import Argon2i, Argon2id
from typing_extensions import Buffer

from app.luks.errors import LuksError

KdfType = Literal["pbkdf2", "argon2i", "argon2id"]
HASHES = ("sha1", "sha256", "sha512")
"""PBKDF2 and AF hashes cryptsetup's defaults and peers use; others are refused."""

MIN_PBKDF2_ITERATIONS = 1000
"""The LUKS1 document's floor for the volume-key digest; cryptsetup applies it everywhere."""
ARGON2_MIN_MEMORY_KIB = 32
ARGON2_MIN_TIME = 4
"""cryptsetup's floors for Argon2 (``--pbkdf-force-iterations`` below 4 is refused)."""
ARGON2_MAX_PARALLEL = 4
"""cryptsetup's threads ceiling for a new keyslot (a header may name more, within the ceiling)."""


@dataclass(frozen=True, slots=True)
class KdfCeiling:
    """The most work one derivation may cost (``REQCRYPT_LUKS_MAX_PBKDF_*``)."""

    memory_kib: int = 1 << 20
    time: int = 64
    parallel: int = 16
    iterations: int = 50_000_000


@dataclass(frozen=True, slots=True)
class Kdf:
    """A keyslot's PBKDF: ``hash``/``iterations`` for PBKDF2, ``time``/``memory_kib``/``parallel``
    for Argon2. The salt is not secret."""

    type: KdfType
    salt: bytes
    hash: str | None = None
    iterations: int = 0
    time: int = 0
    memory_kib: int = 0
    parallel: int = 0

    def check(self, ceiling: KdfCeiling) -> None:
        """Refuse a cost beyond ``ceiling`` or below what any implementation accepts."""
        if self.type == "pbkdf2":
            if self.hash not in HASHES:
                raise LuksError(f"unsupported PBKDF2 hash {self.hash!r} (sha1, sha256, sha512)")
            if not 1 <= self.iterations <= ceiling.iterations:
                raise LuksError(
                    f"PBKDF2 iterations {self.iterations} outside 1..{ceiling.iterations} "
                    "(REQCRYPT_LUKS_MAX_PBKDF_ITERATIONS)"
                )
            return
        if not 1 <= self.time <= ceiling.time:
            raise LuksError(
                f"Argon2 time cost {self.time} outside 1..{ceiling.time} "
                "(REQCRYPT_LUKS_MAX_PBKDF_TIME)"
            )
        if not 8 * max(self.parallel, 1) <= self.memory_kib <= ceiling.memory_kib:
            raise LuksError(
                f"Argon2 memory {self.memory_kib} KiB outside 8 x threads..{ceiling.memory_kib} "
                "(REQCRYPT_LUKS_MAX_PBKDF_MEMORY_KIB)"
            )
        if not 1 <= self.parallel <= ceiling.parallel:
            raise LuksError(
                f"Argon2 threads {self.parallel} outside 1..{ceiling.parallel} "
                "(REQCRYPT_LUKS_MAX_PBKDF_PARALLEL)"
            )
        if len(self.salt) < 8:
            raise LuksError("Argon2 salt shorter than 8 bytes")

    def derive(self, passphrase: Buffer, length: int, ceiling: KdfCeiling) -> bytearray:
        """The keyslot key for ``passphrase``: the costly step, run off the event loop."""
        self.check(ceiling)
        secret = bytes(passphrase)
        if self.type == "pbkdf2":
            assert self.hash is not None
            return bytearray(pbkdf2(self.hash, secret, self.salt, self.iterations, length))
        argon2 = Argon2id if self.type == "argon2id" else Argon2i
        kdf = argon2(
            salt=self.salt,
            length=length,
            iterations=self.time,
            lanes=self.parallel,
            memory_cost=self.memory_kib,
        )
        return bytearray(kdf.derive(secret))


def pbkdf2(hash_name: str, secret: Buffer, salt: bytes, iterations: int, length: int) -> bytes:
    if hash_name not in HASHES:
        raise LuksError(f"unsupported hash {hash_name!r} (sha1, sha256, sha512)")
    return hashlib.pbkdf2_hmac(hash_name, bytes(secret), salt, iterations, length)
