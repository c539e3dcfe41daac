"""Block cipher primitives from pyca/cryptography, by Linux cipher name.

Everything above this module talks in kernel names (``aes``, ``des3_ede``); this
is the one place that knows which cryptography class implements each.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from cryptography.hazmat.decrepit.ciphers import algorithms as decrepit
from cryptography.hazmat.primitives.ciphers import (
    BlockCipherAlgorithm,
    Cipher,
    CipherContext,
    algorithms,
    modes,
)

_ALGORITHMS: dict[str, Callable[..., BlockCipherAlgorithm]] = {
    "aes": algorithms.AES,
    "camellia": decrepit.Camellia,
    "sm4": algorithms.SM4,
    "seed": decrepit.SEED,
    "des3_ede": decrepit.TripleDES,
    "blowfish": decrepit.Blowfish,
    "cast5": decrepit.CAST5,
}


KeyBytes = bytes | bytearray | memoryview
"""What pyca takes as a key: a bytearray or a view of one lets wipe() zero it in place."""


class NullContext:
    """``ecb(cipher_null)``: the identity, with the CipherContext calls the transforms use."""

    def update(self, data: bytes | bytearray | memoryview) -> bytes:
        return bytes(data)

    def finalize(self) -> bytes:
        return b""


def algorithm(name: str, key: KeyBytes) -> BlockCipherAlgorithm:
    return _ALGORITHMS[name](key)


def ecb(name: str, key: KeyBytes, *, encrypt: bool = True) -> CipherContext | NullContext:
    """A reusable ECB context: ECB keeps no state between ``update`` calls."""
    if name == "cipher_null":
        return NullContext()
    cipher = Cipher(algorithm(name, key), modes.ECB())
    return cipher.encryptor() if encrypt else cipher.decryptor()


class SharedEcb(threading.local):
    """An ECB encryptor usable from many threads: one OpenSSL context per thread.

    pyca contexts are not thread-safe ("Already borrowed" under concurrent I/O), and
    an IV generator is shared by every request of a volume.
    """

    def __init__(self, name: str, key: KeyBytes) -> None:
        self._name = name
        self._key = key
        self._context: CipherContext | NullContext | None = None

    def update(self, data: bytes | bytearray | memoryview) -> bytes:
        if self._context is None:
            self._context = ecb(self._name, self._key)
        return self._context.update(data)


def chained(
    name: str, chainmode: str, key: KeyBytes, iv: bytes, *, encrypt: bool
) -> CipherContext | NullContext:
    """One kernel skcipher request's context: ``chainmode(name)`` with this IV/tweak."""
    if name == "cipher_null":
        return NullContext()
    mode: modes.Mode
    if chainmode == "cbc":
        mode = modes.CBC(iv)
    elif chainmode == "xts":
        mode = modes.XTS(iv)
    elif chainmode == "ctr":
        mode = modes.CTR(iv)
    else:
        mode = modes.ECB()
    cipher = Cipher(algorithm(name, key), mode)
    return cipher.encryptor() if encrypt else cipher.decryptor()
