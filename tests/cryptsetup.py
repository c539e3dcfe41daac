"""Debian's cryptsetup (2.6) as the reference peer: format, dump and unlock image files.

scripts/setup installs it (Debian's cryptsetup-bin); no test skips without it. cryptsetup
works on plain files without device-mapper for everything used here. Costs
are the cheapest cryptsetup accepts, so a test spends milliseconds in each PBKDF.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

CHEAP_ARGON2 = ["--pbkdf-memory", "32768", "--pbkdf-force-iterations", "4", "--pbkdf-parallel", "1"]
CHEAP_PBKDF2 = ["--pbkdf-force-iterations", "1000"]


def run(*args: str, passphrase: bytes | None = None, check: bool = True) -> str:
    command = ["cryptsetup", "-q", *args]
    if passphrase is not None:
        command += ["--key-file", "-"]
    result = subprocess.run(command, input=passphrase, capture_output=True, timeout=60)
    if check and result.returncode != 0:
        raise AssertionError(f"{command} failed: {result.stderr.decode()}")
    return result.stdout.decode()


def image(path: Path, size: int = 32 << 20) -> Path:
    with path.open("wb") as file:
        file.truncate(size)
    return path


def luks_format(
    path: Path, passphrase: bytes, *, kind: str, pbkdf: str, sector_size: int = 512
) -> None:
    cost = CHEAP_PBKDF2 if pbkdf == "pbkdf2" else CHEAP_ARGON2
    options = ["--type", kind, "--pbkdf", pbkdf, *cost]
    if kind == "luks2":
        options += ["--sector-size", str(sector_size)]
    run("luksFormat", *options, str(path), passphrase=passphrase)


def volume_key(path: Path, passphrase: bytes) -> bytes:
    """``luksDump --dump-volume-key``: the hex bytes after the key's label, across lines."""
    text = run("luksDump", "--dump-volume-key", str(path), passphrase=passphrase)
    match = re.search(r"(?:MK dump|Volume key):\s*((?:[0-9a-f]{2}\s+)+)", text)
    assert match is not None, text
    return bytes.fromhex("".join(match.group(1).split()))


def opens(path: Path, passphrase: bytes) -> bool:
    result = subprocess.run(
        ["cryptsetup", "open", "--test-passphrase", "--key-file", "-", str(path)],
        input=passphrase,
        capture_output=True,
        timeout=60,
    )
    return result.returncode == 0


def add_key(path: Path, passphrase: bytes, new_passphrase: bytes, *, pbkdf: str) -> None:
    new_file = path.with_suffix(".newkey")
    new_file.write_bytes(new_passphrase)
    cost = CHEAP_PBKDF2 if pbkdf == "pbkdf2" else CHEAP_ARGON2
    run("luksAddKey", "--pbkdf", pbkdf, *cost, str(path), str(new_file), passphrase=passphrase)
    new_file.unlink()
