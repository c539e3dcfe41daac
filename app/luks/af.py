"""The anti-forensic splitter of the LUKS1 document (LUKS2's ``"af": {"type": "luks1"}``).

A key of n bytes is stored as ``stripes`` blocks of n bytes: all but the last are random,
each folded into a running block by XOR and ``diffuse``; the last is that block XOR the
key. Every stripe is needed to merge the key back, so overwriting any part of the
keyslot area destroys it. Whole-stripe numpy XORs and one hash call per digest-sized
piece keep the 4000-stripe loop off per-byte Python.
"""

from __future__ import annotations

import hashlib
import secrets

import numpy as np
from typing_extensions import Buffer

from app.luks.errors import LuksError
from app.luks.kdf import HASHES


def diffuse(block: bytearray, hash_name: str) -> bytearray:
    """Hash each digest-sized piece of ``block`` with its big-endian index in front."""
    size = hashlib.new(hash_name).digest_size
    out = bytearray(len(block))
    for index, start in enumerate(range(0, len(block), size)):
        piece = block[start : start + size]
        digest = hashlib.new(hash_name, index.to_bytes(4, "big") + piece).digest()
        out[start : start + len(piece)] = digest[: len(piece)]
    return out


def _check(hash_name: str, stripes: int) -> None:
    if hash_name not in HASHES:
        raise LuksError(f"unsupported AF hash {hash_name!r} (sha1, sha256, sha512)")
    if stripes < 1:
        raise LuksError(f"AF stripes {stripes} < 1")


def split(key: Buffer, stripes: int, hash_name: str) -> bytearray:
    """``stripes`` x len(key) bytes from which ``merge`` recovers ``key``."""
    _check(hash_name, stripes)
    key_view = memoryview(key).cast("B")
    n = len(key_view)
    out = bytearray(secrets.token_bytes(n * stripes))
    running = bytearray(n)
    stripe_arrays = np.frombuffer(out, dtype=np.uint8).reshape(stripes, n)
    for i in range(stripes - 1):
        running = diffuse(bytearray(np.bitwise_xor(running, stripe_arrays[i]).tobytes()), hash_name)
    out[(stripes - 1) * n :] = np.bitwise_xor(
        np.frombuffer(running, dtype=np.uint8), np.frombuffer(key_view, dtype=np.uint8)
    ).tobytes()
    return out


def merge(material: Buffer, key_size: int, stripes: int, hash_name: str) -> bytearray:
    """The key ``split`` spread over ``material`` (its first key_size x stripes bytes)."""
    _check(hash_name, stripes)
    view = memoryview(material).cast("B")
    if len(view) < key_size * stripes:
        raise LuksError("keyslot area shorter than key size x AF stripes")
    stripe_arrays = np.frombuffer(view[: key_size * stripes], dtype=np.uint8).reshape(
        stripes, key_size
    )
    running = bytearray(key_size)
    for i in range(stripes - 1):
        running = diffuse(bytearray(np.bitwise_xor(running, stripe_arrays[i]).tobytes()), hash_name)
    return bytearray(
        np.bitwise_xor(np.frombuffer(running, dtype=np.uint8), stripe_arrays[-1]).tobytes()
    )
