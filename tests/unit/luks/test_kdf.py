"""Timed PBKDF costs (cryptsetup's ``--iter-time``): proportional to the time asked for,
measured in this thread's CPU time, and never past the ceiling."""

from __future__ import annotations

import time

from app.luks.kdf import ARGON2_MIN_TIME, KdfCeiling, pbkdf2, timed_argon2, timed_pbkdf2

CEILING = KdfCeiling()


def test_pbkdf2_iterations_follow_the_time_asked_for() -> None:
    short = timed_pbkdf2("sha256", 64, 10, CEILING)
    long = timed_pbkdf2("sha256", 64, 40, CEILING)
    assert 2 <= long / short <= 8
    started = time.thread_time()
    pbkdf2("sha256", b"passphrase", bytes(32), long, 64)
    assert 0.01 <= time.thread_time() - started <= 0.16


def test_pbkdf2_iterations_stay_within_the_floor_and_the_ceiling() -> None:
    assert timed_pbkdf2("sha256", 32, 1, CEILING) >= 1000
    assert timed_pbkdf2("sha256", 32, 500, KdfCeiling(iterations=3000)) == 3000


def test_argon2_shrinks_the_memory_when_four_passes_already_take_too_long() -> None:
    passes, memory = timed_argon2("argon2id", 64, 5, 1 << 20, 1, CEILING, memory_fixed=False)
    assert passes == ARGON2_MIN_TIME
    assert 32 <= memory < 1 << 20


def test_argon2_adds_passes_at_a_fixed_memory_up_to_the_ceiling() -> None:
    passes, memory = timed_argon2("argon2id", 64, 200, 4096, 1, CEILING, memory_fixed=True)
    assert memory == 4096
    assert passes > ARGON2_MIN_TIME
    capped, _ = timed_argon2("argon2i", 64, 200, 4096, 1, KdfCeiling(time=5), memory_fixed=True)
    assert capped == 5
