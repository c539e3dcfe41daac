"""IV generators with the semantics of dm-crypt's ``crypt_iv_*_gen``.

Each generator maps an ``iv_sector`` (the kernel's ``dmreq->iv_sector``, already
shifted when ``iv_large_sectors`` is set) to the IV of one data unit. The
scalar ``generator``/``post`` pair mirrors ``struct crypt_iv_operations`` and is
what the reference transform calls; ``generate_many`` builds the IVs of a whole
request at once for the bulk transform, and exists only where the IV does not
depend on the data (everything but lmk and tcw).

ESSIV follows kernels >= 5.4, where the crypto API template ``essiv(...)`` owns
the salt: each tfm hashes its own subkey (with keycount 1 that is the whole key,
as in older kernels).
"""

from __future__ import annotations

import math
import struct
import zlib
from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives import hashes

from app import _native
from app.crypto import _ciphers
from app.crypto.keys import zero
from app.crypto.spec import TCW_WHITENING_SIZE, CipherSpec

__all__ = ["IvGenerator", "make_iv_generator"]

U64 = npt.NDArray[np.uint64]
U8 = npt.NDArray[np.uint8]

_MASK64 = (1 << 64) - 1
_ESSIV_HASHES: dict[str, type[hashes.HashAlgorithm]] = {
    "sha256": hashes.SHA256,
    "md5": hashes.MD5,
    "sha1": hashes.SHA1,
    "sha512": hashes.SHA512,
    "sha384": hashes.SHA384,
    "sha224": hashes.SHA224,
    "sha3-256": hashes.SHA3_256,
    "sm3": hashes.SM3,
}


class IvGenerator(ABC):
    """One IV mode bound to a key; ``subkeys[i]`` is tfm ``i``'s key (``key_index`` i)."""

    name: ClassVar[str]
    data_dependent: ClassVar[bool] = False

    def __init__(
        self, spec: CipherSpec, subkeys: list[bytearray], extra: bytearray, sector_size: int
    ):
        self.spec = spec
        self.iv_size = spec.iv_size
        self.sector_size = sector_size

    @abstractmethod
    def generate(self, iv_sector: int, key_index: int = 0) -> bytes:
        """The IV of one data unit (kernel ``generator`` for data-independent modes)."""

    def generator(self, iv_sector: int, key_index: int, unit: bytearray, encrypt: bool) -> bytes:
        """Kernel ``generator``: may read (lmk) or rewrite (tcw, reads) the unit before the cipher."""
        return self.generate(iv_sector, key_index)

    def post(self, iv_sector: int, iv: bytes, unit: bytearray, encrypt: bool) -> None:  # noqa: B027
        """Kernel ``post``: runs on the cipher's output unit (lmk reads, tcw writes)."""

    def generate_many(self, iv_sectors: U64, key_index: int = 0) -> U8:
        """IVs of many units as an ``(n, iv_size)`` array; subclasses vectorize this."""
        out = np.empty((len(iv_sectors), self.iv_size), dtype=np.uint8)
        for row, iv_sector in enumerate(iv_sectors.tolist()):
            out[row] = np.frombuffer(self.generate(iv_sector, key_index), dtype=np.uint8)
        return out

    def wipe(self) -> None:  # noqa: B027
        """Forget derived key material (salts, seeds)."""


class NullIv(IvGenerator):
    """``null``: all-zero IV (loop_fish2 compatibility)."""

    name = "null"

    def generate(self, iv_sector: int, key_index: int = 0) -> bytes:
        return bytes(self.iv_size)

    def generate_many(self, iv_sectors: U64, key_index: int = 0) -> U8:
        return np.zeros((len(iv_sectors), self.iv_size), dtype=np.uint8)


class PlainIv(IvGenerator):
    """``plain``: le32 of the sector, truncated, so it wraps every 2^32 sectors."""

    name = "plain"

    def generate(self, iv_sector: int, key_index: int = 0) -> bytes:
        return struct.pack("<I", iv_sector & 0xFFFFFFFF).ljust(self.iv_size, b"\0")

    def generate_many(self, iv_sectors: U64, key_index: int = 0) -> U8:
        out = np.zeros((len(iv_sectors), self.iv_size), dtype=np.uint8)
        low = (iv_sectors & np.uint64(0xFFFFFFFF)).astype("<u4")
        out[:, :4] = low.view(np.uint8).reshape(-1, 4)
        return out


class Plain64Iv(IvGenerator):
    """``plain64``: le64 of the sector, zero padded."""

    name = "plain64"

    def generate(self, iv_sector: int, key_index: int = 0) -> bytes:
        return struct.pack("<Q", iv_sector & _MASK64).ljust(self.iv_size, b"\0")

    def generate_many(self, iv_sectors: U64, key_index: int = 0) -> U8:
        words = np.zeros((len(iv_sectors), self.iv_size // 8), dtype="<u8")
        words[:, 0] = iv_sectors
        return words.view(np.uint8)


class Plain64BeIv(IvGenerator):
    """``plain64be``: be64 of the sector in the last 8 bytes."""

    name = "plain64be"

    def generate(self, iv_sector: int, key_index: int = 0) -> bytes:
        return struct.pack(">Q", iv_sector & _MASK64).rjust(self.iv_size, b"\0")

    def generate_many(self, iv_sectors: U64, key_index: int = 0) -> U8:
        out = np.zeros((len(iv_sectors), self.iv_size), dtype=np.uint8)
        out[:, -8:] = iv_sectors.astype(">u8").view(np.uint8).reshape(-1, 8)
        return out


class BenbiIv(IvGenerator):
    """``benbi``: be64 count of narrow blocks, starting at 1: ``(sector << shift) + 1``.

    ``shift = 9 - log2(skcipher block size)``: 5 for cbc(aes), 9 for ctr (block size 1).
    """

    name = "benbi"

    def __init__(
        self, spec: CipherSpec, subkeys: list[bytearray], extra: bytearray, sector_size: int
    ):
        super().__init__(spec, subkeys, extra, sector_size)
        self.shift = 9 - (spec.skcipher_block_size.bit_length() - 1)

    def generate(self, iv_sector: int, key_index: int = 0) -> bytes:
        value = ((iv_sector << self.shift) + 1) & _MASK64
        return struct.pack(">Q", value).rjust(self.iv_size, b"\0")

    def generate_many(self, iv_sectors: U64, key_index: int = 0) -> U8:
        out = np.zeros((len(iv_sectors), self.iv_size), dtype=np.uint8)
        values = (iv_sectors << np.uint64(self.shift)) + np.uint64(1)
        out[:, -8:] = values.astype(">u8").view(np.uint8).reshape(-1, 8)
        return out


class EssivIv(IvGenerator):
    """``essiv:<hash>``: ``E_salt(le64 sector)`` with ``salt = hash(subkey)``."""

    name = "essiv"

    def __init__(
        self, spec: CipherSpec, subkeys: list[bytearray], extra: bytearray, sector_size: int
    ):
        super().__init__(spec, subkeys, extra, sector_size)
        assert spec.ivopts is not None
        self._salts: list[bytearray] = []
        self._salt_ciphers = []
        for subkey in subkeys:
            digest = hashes.Hash(_ESSIV_HASHES[spec.ivopts]())
            digest.update(subkey)
            salt = bytearray(digest.finalize())
            self._salts.append(salt)
            self._salt_ciphers.append(_ciphers.SharedEcb(spec.cipher, salt))
        self._plain64 = Plain64Iv(spec, subkeys, extra, sector_size)

    def generate(self, iv_sector: int, key_index: int = 0) -> bytes:
        plain = self._plain64.generate(iv_sector)
        return self._salt_ciphers[key_index].update(plain)

    def aes_salt(self, key_index: int = 0) -> bytearray | None:
        """Tfm ``key_index``'s salt where the IVs are AES under it (an AES key's size), else
        None; the salt itself, so ``wipe`` zeroes what callers hold."""
        salt = self._salts[key_index]
        return salt if self.spec.cipher == "aes" and len(salt) in (16, 24, 32) else None

    def generate_many(self, iv_sectors: U64, key_index: int = 0) -> U8:
        salt = self.aes_salt(key_index)
        if salt is not None:
            # One native pass instead of numpy's plain64 blocks and a copy each side of ECB.
            out = np.empty((len(iv_sectors), self.iv_size), dtype=np.uint8)
            sectors = np.ascontiguousarray(iv_sectors, dtype=np.uint64)
            _native.essiv(out, sectors, salt)
            return out
        plain = self._plain64.generate_many(iv_sectors)
        sealed = self._salt_ciphers[key_index].update(plain.tobytes())
        return np.frombuffer(sealed, dtype=np.uint8).reshape(-1, self.iv_size)

    def wipe(self) -> None:
        for salt in self._salts:
            zero(salt)
        self._salt_ciphers.clear()


class EboivIv(IvGenerator):
    """``eboiv`` (BitLocker): ``E_key(le64 byte offset)``, byte offset = iv_sector * sector_size.

    The kernel encrypts with tfm 0 (``any_tfm``) whatever the data unit's key index.
    """

    name = "eboiv"

    def __init__(
        self, spec: CipherSpec, subkeys: list[bytearray], extra: bytearray, sector_size: int
    ):
        super().__init__(spec, subkeys, extra, sector_size)
        self._cipher: _ciphers.SharedEcb | _ciphers.NullContext = _ciphers.SharedEcb(
            spec.cipher, subkeys[0]
        )

    def generate(self, iv_sector: int, key_index: int = 0) -> bytes:
        offset = (iv_sector * self.sector_size) & _MASK64
        return self._cipher.update(struct.pack("<Q", offset).ljust(self.iv_size, b"\0"))

    def generate_many(self, iv_sectors: U64, key_index: int = 0) -> U8:
        plain = np.zeros((len(iv_sectors), self.iv_size), dtype=np.uint8)
        offsets = iv_sectors * np.uint64(self.sector_size)
        plain[:, :8] = offsets.astype("<u8").view(np.uint8).reshape(-1, 8)
        sealed = self._cipher.update(plain.tobytes())
        return np.frombuffer(sealed, dtype=np.uint8).reshape(-1, self.iv_size)

    def wipe(self) -> None:
        self._cipher = _ciphers.NullContext()


class LmkIv(IvGenerator):
    """``lmk`` (loop-AES v2/v3): IV = raw MD5 state over [seed,] blocks 1..31 and the sector.

    Writes derive the IV from the plaintext; reads decrypt with a zero IV, then
    ``post`` derives the IV from the decrypted blocks 1..31 and XORs it into block 0.
    """

    name = "lmk"
    data_dependent = True
    SEED_SIZE = 64

    def __init__(
        self, spec: CipherSpec, subkeys: list[bytearray], extra: bytearray, sector_size: int
    ):
        super().__init__(spec, subkeys, extra, sector_size)
        # Version 3 keeps the 65th key as seed: its first 16 bytes (the MD5 digest size),
        # zero padded to 64 bytes, are hashed before the data.
        self._seed = bytearray(self.SEED_SIZE if extra else 0)
        self._seed[: min(16, len(extra))] = memoryview(extra)[:16]

    def generate(self, iv_sector: int, key_index: int = 0) -> bytes:
        raise TypeError("lmk IVs depend on the data: use generator()/post()")

    def _iv(self, iv_sector: int, plain_unit: bytes | bytearray) -> bytes:
        tail = struct.pack(
            "<IIII",
            iv_sector & 0xFFFFFFFF,
            ((iv_sector >> 32) & 0x00FFFFFF) | 0x80000000,
            4024,
            0,
        )
        message = self._seed + bytes(plain_unit[16:512]) + tail
        return md5_state(message)[: self.iv_size]

    def generator(self, iv_sector: int, key_index: int, unit: bytearray, encrypt: bool) -> bytes:
        if encrypt:
            return self._iv(iv_sector, unit)
        return bytes(self.iv_size)

    def post(self, iv_sector: int, iv: bytes, unit: bytearray, encrypt: bool) -> None:
        if encrypt:
            return
        fix = self._iv(iv_sector, unit)
        for index in range(self.iv_size):
            unit[index] ^= fix[index]

    def wipe(self) -> None:
        zero(self._seed)
        self._seed = bytearray()


class TcwIv(IvGenerator):
    """``tcw`` (TrueCrypt < 4.1): IV = iv_seed XOR le64 sector; CRC32-mixed whitening on ciphertext."""

    name = "tcw"
    data_dependent = True

    def __init__(
        self, spec: CipherSpec, subkeys: list[bytearray], extra: bytearray, sector_size: int
    ):
        super().__init__(spec, subkeys, extra, sector_size)
        with memoryview(extra) as secret:
            self._iv_seed = bytearray(secret[: self.iv_size])
            self._whitening = bytearray(secret[self.iv_size : self.iv_size + TCW_WHITENING_SIZE])

    def generate(self, iv_sector: int, key_index: int = 0) -> bytes:
        sector = struct.pack("<Q", iv_sector & _MASK64)
        pad = (sector * ((self.iv_size + 7) // 8))[: self.iv_size]
        return bytes(a ^ b for a, b in zip(self._iv_seed, pad, strict=True))

    def _whiten(self, iv_sector: int, unit: bytearray) -> None:
        sector = struct.pack("<Q", iv_sector & _MASK64)
        buf = bytes(a ^ b for a, b in zip(self._whitening, sector * 2, strict=True))
        # The kernel's "crc32" shash starts at 0 and skips the final inversion.
        words = [zlib.crc32(buf[i : i + 4], 0xFFFFFFFF) ^ 0xFFFFFFFF for i in range(0, 16, 4)]
        mask = struct.pack("<II", words[0] ^ words[3], words[1] ^ words[2])
        whitened = np.frombuffer(unit, dtype=np.uint64, count=64) ^ np.frombuffer(
            mask, dtype=np.uint64
        )
        unit[:512] = whitened.tobytes()

    def generator(self, iv_sector: int, key_index: int, unit: bytearray, encrypt: bool) -> bytes:
        if not encrypt:
            self._whiten(iv_sector, unit)
        return self.generate(iv_sector, key_index)

    def post(self, iv_sector: int, iv: bytes, unit: bytearray, encrypt: bool) -> None:
        if encrypt:
            self._whiten(iv_sector, unit)

    def wipe(self) -> None:
        zero(self._iv_seed)
        zero(self._whitening)
        self._iv_seed = bytearray()
        self._whitening = bytearray()


_GENERATORS: dict[str, type[IvGenerator]] = {
    cls.name: cls
    for cls in (NullIv, PlainIv, Plain64Iv, Plain64BeIv, BenbiIv, EssivIv, EboivIv, LmkIv, TcwIv)
}


def make_iv_generator(
    spec: CipherSpec, subkeys: list[bytearray], extra: bytearray, sector_size: int
) -> IvGenerator | None:
    """The generator for ``spec.ivmode``, or None for ecb (no IV)."""
    if spec.ivmode is None:
        return None
    return _GENERATORS[spec.ivmode](spec, subkeys, extra, sector_size)


# --- MD5 without finalization (lmk exports the raw state, no padding) -------------------

_MD5_S = [7, 12, 17, 22] * 4 + [5, 9, 14, 20] * 4 + [4, 11, 16, 23] * 4 + [6, 10, 15, 21] * 4
_MD5_K = [int(abs(math.sin(i + 1)) * 2**32) & 0xFFFFFFFF for i in range(64)]


def _rotl(value: int, count: int) -> int:
    return ((value << count) | (value >> (32 - count))) & 0xFFFFFFFF


def md5_state(message: bytes | bytearray) -> bytes:
    """MD5 chaining state after ``message`` (a multiple of 64 bytes), le32 words, unpadded."""
    if len(message) % 64:
        raise ValueError("md5_state needs whole 64-byte blocks")
    state = [0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476]
    for offset in range(0, len(message), 64):
        words = struct.unpack_from("<16I", message, offset)
        a, b, c, d = state
        for i in range(64):
            if i < 16:
                f, g = (b & c) | (~b & d), i
            elif i < 32:
                f, g = (d & b) | (~d & c), (5 * i + 1) % 16
            elif i < 48:
                f, g = b ^ c ^ d, (3 * i + 5) % 16
            else:
                f, g = c ^ (b | (~d & 0xFFFFFFFF)), (7 * i) % 16
            f = (f + a + _MD5_K[i] + words[g]) & 0xFFFFFFFF
            a, d, c = d, c, b
            b = (b + _rotl(f, _MD5_S[i])) & 0xFFFFFFFF
        state = [(x + y) & 0xFFFFFFFF for x, y in zip(state, (a, b, c, d), strict=True)]
    return struct.pack("<4I", *state)
