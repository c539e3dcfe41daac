"""Password-based key derivation of LUKS keyslots: PBKDF2 (LUKS1 and LUKS2), Argon2i/id (LUKS2).

A header names its own costs, so a hostile one could ask for terabytes of memory or
years of hashing: every derivation is checked against ``KdfCeiling`` first, before any
work, and refused as ``LuksError``. One derivation within its ceilings is not enough: a
wrong passphrase tries every keyslot, so an unlock's total is bounded too, counted in
``work`` units before any derivation runs.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
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

HASH_BLOCK_WORK = {"sha1": 1, "sha256": 1, "sha512": 2}
"""Work units of one PBKDF2 iteration over one block of the hash's output: an HMAC, the
unit itself; SHA-512's, over 128-byte blocks, costs about two SHA-256 ones."""
ARGON2_KIB_PASS_WORK = 4
"""Work units of one Argon2 pass over 1 KiB of memory (one block compression): about four
HMAC-SHA256s of CPU, measured with OpenSSL's implementations of both. Threads share out
the blocks, they do not remove any, so parallelism does not divide it."""


def pbkdf2_work(hash_name: str, iterations: int, length: int) -> int:
    """Work units of a PBKDF2 derivation of ``length`` bytes: an HMAC per iteration per
    hash-sized block of output (a 512-bit key from SHA-256 is two blocks)."""
    if hash_name not in HASHES:
        raise LuksError(f"unsupported hash {hash_name!r} (sha1, sha256, sha512)")
    blocks = -(-length // hashlib.new(hash_name).digest_size)
    return iterations * blocks * HASH_BLOCK_WORK[hash_name]


@dataclass(frozen=True, slots=True)
class KdfCeiling:
    """The most work one derivation may cost (``REQCRYPT_LUKS_MAX_PBKDF_*``), and all those of
    one unlock together (``unlock_work``, REQCRYPT_LUKS_MAX_UNLOCK_WORK)."""

    memory_kib: int = 1 << 20
    time: int = 64
    parallel: int = 16
    iterations: int = 50_000_000
    unlock_work: int = 200_000_000
    """About 45 s of one core: four keyslots of 1 GiB x 11 Argon2 passes (cryptsetup picks 4
    to 10 for its 2 s on four threads), or all eight LUKS1 keyslots at 10,000,000
    PBKDF2-SHA256 iterations of a 512-bit key, with their digests, fit; 32 keyslots at the
    per-keyslot ceilings (about an hour) do not."""


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
                f"Argon2 memory {self.memory_kib} KiB outside "
                f"{8 * max(self.parallel, 1)}..{ceiling.memory_kib} (8 KiB per thread at least, "
                "REQCRYPT_LUKS_MAX_PBKDF_MEMORY_KIB at most)"
            )
        if not 1 <= self.parallel <= ceiling.parallel:
            raise LuksError(
                f"Argon2 threads {self.parallel} outside 1..{ceiling.parallel} "
                "(REQCRYPT_LUKS_MAX_PBKDF_PARALLEL)"
            )
        if len(self.salt) < 8:
            raise LuksError("Argon2 salt shorter than 8 bytes")

    def work(self, length: int) -> int:
        """Work units of deriving ``length`` bytes: ``pbkdf2_work``, or for Argon2 its memory
        (KiB) x passes x ``ARGON2_KIB_PASS_WORK``, whatever its threads."""
        if self.type == "pbkdf2":
            assert self.hash is not None
            return pbkdf2_work(self.hash, self.iterations, length)
        return self.memory_kib * self.time * ARGON2_KIB_PASS_WORK

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


def _seconds_per_unit(work: Callable[[int], object], units: int, enough: float) -> float:
    """CPU seconds of this thread per unit of ``work(units)``, doubling ``units`` until one run
    takes ``enough``: thread CPU time, so other threads and the machine's load do not count."""
    while True:
        started = time.thread_time()
        work(units)
        spent = time.thread_time() - started
        if spent >= enough:
            return spent / units
        units *= 2


def _benchmark_span(target_ms: int) -> float:
    """How long the measuring run lasts: an eighth of the target, within 5..100 ms."""
    return min(0.1, max(0.005, target_ms / 8000))


def timed_pbkdf2(hash_name: str, key_bytes: int, target_ms: int, ceiling: KdfCeiling) -> int:
    """PBKDF2 iterations that take about ``target_ms`` here (cryptsetup's ``--iter-time``),
    at least ``MIN_PBKDF2_ITERATIONS`` and at most the ceiling."""
    salt = bytes(32)
    per_iteration = _seconds_per_unit(
        lambda n: pbkdf2(hash_name, b"benchmark", salt, n, key_bytes),
        MIN_PBKDF2_ITERATIONS,
        _benchmark_span(target_ms),
    )
    iterations = int(target_ms / 1000 / per_iteration)
    return max(MIN_PBKDF2_ITERATIONS, min(iterations, ceiling.iterations))


def timed_argon2(
    kind: KdfType,
    key_bytes: int,
    target_ms: int,
    memory_kib: int,
    parallel: int,
    ceiling: KdfCeiling,
    *,
    memory_fixed: bool,
) -> tuple[int, int]:
    """(time cost, memory KiB) of an Argon2 derivation taking about ``target_ms`` here.

    As cryptsetup does: the passes grow from 4 at ``memory_kib``; when 4 passes already take
    longer, the memory shrinks instead (unless the caller fixed it). Cost is taken as
    proportional to memory x passes, measured at 4 passes on a growing memory size.
    """
    argon2 = Argon2id if kind == "argon2id" else Argon2i
    floor = max(ARGON2_MIN_MEMORY_KIB, 8 * parallel)

    def derive(memory: int) -> bytes:
        return argon2(
            salt=bytes(16),
            length=key_bytes,
            iterations=ARGON2_MIN_TIME,
            lanes=parallel,
            memory_cost=memory,
        ).derive(b"benchmark")

    per_kib_pass = (
        _seconds_per_unit(derive, min(max(floor, 1024), memory_kib), _benchmark_span(target_ms))
        / ARGON2_MIN_TIME
    )
    budget = target_ms / 1000 / per_kib_pass
    passes = int(budget / memory_kib)
    if passes >= ARGON2_MIN_TIME or memory_fixed:
        return max(ARGON2_MIN_TIME, min(passes, ceiling.time)), memory_kib
    return ARGON2_MIN_TIME, max(floor, int(budget / ARGON2_MIN_TIME))


def pbkdf2(hash_name: str, secret: Buffer, salt: bytes, iterations: int, length: int) -> bytes:
    if hash_name not in HASHES:
        raise LuksError(f"unsupported hash {hash_name!r} (sha1, sha256, sha512)")
    return hashlib.pbkdf2_hmac(hash_name, bytes(secret), salt, iterations, length)
