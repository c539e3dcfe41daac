"""Key material that does not leak, and AEAD key wrapping for storage.

Keys live in a ``bytearray`` so ``wipe()`` can zero them (``dmsetup message key
wipe``); ``repr``/``str``/errors show only a length. Stored keys are wrapped
with AES-256-GCM under the service master key, with the volume identity as
associated data, so a blob copied onto another volume fails to unwrap.
"""

from __future__ import annotations

import hmac
import os
import string

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from typing_extensions import Buffer

from app.errors import CipherSpecError, ReqcryptError

__all__ = ["KeyMaterial", "KeyUnwrapError", "unwrap_key", "wrap_key", "zero"]

_HEX_DIGITS = frozenset(string.hexdigits)
_WRAP_VERSION = b"\x01"
_NONCE_SIZE = 12
_MASTER_KEY_SIZE = 32


def zero(secret: bytearray) -> None:
    """Overwrite ``secret`` with zeros in place (same size: works while views are exported)."""
    secret[:] = bytes(len(secret))


class KeyUnwrapError(ReqcryptError):
    """A wrapped key failed authentication: wrong master key, wrong volume, or corrupted."""


class KeyMaterial:
    """Secret key bytes; shows its length, never its content, unless ``hex()`` is asked."""

    __slots__ = ("_data",)

    def __init__(self, data: Buffer = b"") -> None:
        self._data = bytearray(data)

    @classmethod
    def from_hex(cls, text: str) -> KeyMaterial:
        """Decode a table key; ``-`` is the empty key. Errors never echo the text."""
        if text == "-":
            return cls()
        if len(text) % 2:
            raise CipherSpecError(f"key has an odd number of hex digits ({len(text)})")
        if not _HEX_DIGITS.issuperset(text):
            raise CipherSpecError("key is not hexadecimal")
        return cls(bytes.fromhex(text))

    def hex(self) -> str:
        """The table form (``-`` when empty), for an explicit ``show_keys`` only."""
        return self._data.hex() if self._data else "-"

    def to_bytes(self) -> bytes:
        """An immutable copy for cipher constructors; callers must not keep it."""
        return bytes(self._data)

    def view(self) -> memoryview:
        return memoryview(self._data)

    def wipe(self) -> None:
        """Zero the bytes in place and forget the length.

        The zeroed buffer is dropped rather than shrunk: a view exported by ``view()``
        forbids resizing, and zeroing in place is what keeps the secret out of memory.
        """
        zero(self._data)
        self._data = bytearray()

    def __len__(self) -> int:
        return len(self._data)

    def __bool__(self) -> bool:
        return bool(self._data)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KeyMaterial):
            return NotImplemented
        return hmac.compare_digest(self._data, other._data)

    __hash__ = None  # type: ignore[assignment]  # mutable secret: never a dict key

    def __repr__(self) -> str:
        return f"<KeyMaterial {len(self._data)} bytes>"

    __str__ = __repr__

    def __reduce__(self) -> str:
        raise TypeError("KeyMaterial is not picklable: wrap it with wrap_key() to store it")


def _aead(master: Buffer) -> AESGCM:
    master_bytes = bytes(master)
    if len(master_bytes) != _MASTER_KEY_SIZE:
        raise CipherSpecError(
            f"master key must be {_MASTER_KEY_SIZE} bytes, got {len(master_bytes)}"
        )
    return AESGCM(master_bytes)


def wrap_key(master: Buffer, key: KeyMaterial, aad: bytes) -> bytes:
    """Seal ``key`` under ``master``; ``aad`` (the volume identity) binds it to one volume.

    Blob layout: version byte, 12-byte random nonce, GCM ciphertext + 16-byte tag.
    """
    nonce = os.urandom(_NONCE_SIZE)
    with key.view() as plain:  # no immutable copy of the key left behind
        sealed = _aead(master).encrypt(nonce, plain, _WRAP_VERSION + aad)
    return _WRAP_VERSION + nonce + sealed


def unwrap_key(master: Buffer, blob: bytes, aad: bytes) -> KeyMaterial:
    """Open a blob from ``wrap_key``; any mismatch raises ``KeyUnwrapError`` without detail."""
    aead = _aead(master)
    if len(blob) < 1 + _NONCE_SIZE + 16 or blob[:1] != _WRAP_VERSION:
        raise KeyUnwrapError("wrapped key is malformed")
    nonce = blob[1 : 1 + _NONCE_SIZE]
    try:
        plain = aead.decrypt(nonce, blob[1 + _NONCE_SIZE :], _WRAP_VERSION + aad)
    except InvalidTag:
        raise KeyUnwrapError(
            "wrapped key failed authentication: wrong master key or volume identity"
        ) from None
    material = KeyMaterial(plain)
    del plain
    return material
