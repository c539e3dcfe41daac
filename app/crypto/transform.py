"""Sector transforms: dm-crypt's per-data-unit conversion, and a bulk equivalent.

Geometry, as in ``crypt_convert``: ``sector`` is the 512-byte offset of
``data[0]`` inside the target (``dm_target_offset``). Data unit ``i`` has
``cc_sector = sector + iv_offset + i * (sector_size >> 9)`` (mod 2^64),
``iv_sector = cc_sector >> sector_shift`` when ``iv_large_sectors`` is set (else
``cc_sector``), and uses tfm ``cc_sector & (keycount - 1)``.

``ReferenceTransform`` makes one cipher call per data unit and is the
executable specification. ``BulkTransform`` computes the same bytes for a whole
request around a few OpenSSL ECB calls per chunk (ADR 0001): XTS whitening in
one C pass per direction (``app/_native.c``, GIL released), AES-XTS and AES-CBC in one
native call on the CPU's AES instructions (CBC in parallel lanes of data units; other
ciphers, or a CPU without AES instructions: ECB plus numpy, CBC encryption one block
column of all units at a time), CTR counters built with numpy. aes-xts-plain64 and
aes-cbc-essiv with one key make their IVs in that native call: one call per request.

XTS with equal key halves, and XTS with 2x192-bit keys, are accepted like the
kernel outside FIPS mode; OpenSSL refuses both, so those keys go through the
ECB construction on both paths (ADR 0002).
"""

from __future__ import annotations

import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Final, Literal, TypedDict

import numpy as np
import numpy.typing as npt
from typing_extensions import Buffer, Unpack

from app import _native
from app.crypto import _ciphers
from app.crypto.iv import EssivIv, IvGenerator, make_iv_generator
from app.crypto.keys import KeyMaterial, zero
from app.crypto.spec import CipherSpec
from app.errors import CipherSpecError, KeyNotSet
from app.vocab import SECTOR_SHIFT, SECTOR_SIZE_512_ONLY_IV_MODES

__all__ = [
    "BulkTransform",
    "CryptTransform",
    "ReferenceTransform",
    "make_transform",
]

_MASK64 = (1 << 64) - 1
_XTS_POLY = 0x87
CHUNK_BYTES = 2 << 20
"""Bulk work unit: big enough to amortize numpy call overhead, small enough for L2/L3."""
AUTO_MIN_UNITS = 2
"""Below this many data units "auto" uses the per-unit path (measured crossover: 2 units
for xts, cbc decryption and ecb at 512 and 4096 B; ctr breaks even at about 3)."""

U8 = npt.NDArray[np.uint8]
U64 = npt.NDArray[np.uint64]
Impl = Literal["reference", "bulk", "auto"]

if sys.byteorder != "little":  # pragma: no cover - the uint64 views below assume it
    raise ImportError("app.crypto.transform assumes a little-endian host")


class Geometry(TypedDict, total=False):
    """Where a target's data units sit: ``CryptTransform``'s keywords, which the other
    constructors pass on (defaults there)."""

    sector_size: int
    iv_offset: int
    iv_large_sectors: bool


class CryptTransform(ABC):
    """Encrypt/decrypt whole data units of one crypt target, byte-compatible with dm-crypt.

    ``spec`` and the geometry attributes are fixed for the transform's life (``Final``).
    """

    def __init__(
        self,
        spec: CipherSpec,
        key: KeyMaterial,
        *,
        sector_size: int = 512,
        iv_offset: int = 0,
        iv_large_sectors: bool = False,
    ) -> None:
        if sector_size < 512 or sector_size > 4096 or sector_size & (sector_size - 1):
            raise CipherSpecError("invalid sector_size: must be a power of two in 512..4096")
        step = sector_size >> SECTOR_SHIFT
        if not 0 <= iv_offset <= _MASK64 or iv_offset % step:
            raise CipherSpecError("invalid iv_offset sector: must be a multiple of sector_size/512")
        if spec.ivmode in SECTOR_SIZE_512_ONLY_IV_MODES and sector_size != 512:
            raise CipherSpecError(f"unsupported sector size for {spec.ivmode.upper()}")
        if spec.chainmode != "ecb" and sector_size % spec.block_size:
            raise CipherSpecError("sector_size is not a multiple of the cipher block size")
        spec.check_key(key)
        self.spec: Final = spec
        self._key = KeyMaterial(key.view())
        self.sector_size: Final = sector_size
        self.sector_shift: Final = step.bit_length() - 1
        self.iv_offset: Final = iv_offset
        self.iv_large_sectors: Final = iv_large_sectors
        # Derived copies are bytearrays so that wipe() can zero them, not just drop them.
        size = spec.key_layout(len(self._key)).subkey_size
        with self._key.view() as raw:
            self._subkeys: list[bytearray] = [
                bytearray(raw[i * size : (i + 1) * size]) for i in range(spec.keycount)
            ]
            self._extra = bytearray(raw[spec.keycount * size :])
        self._ivgen: IvGenerator | None = make_iv_generator(
            spec, self._subkeys, self._extra, sector_size
        )
        self._wiped = False

    def encrypt(self, data: Buffer, sector: int) -> bytes:
        """Ciphertext of ``data`` (whole data units) written at target ``sector``."""
        return self._run(data, sector, encrypt=True)

    def decrypt(self, data: Buffer, sector: int) -> bytes:
        """Plaintext of ``data`` (whole data units) read from target ``sector``."""
        return self._run(data, sector, encrypt=False)

    def encrypt_into(self, data: Buffer, sector: int, out: Buffer) -> None:
        """Like ``encrypt`` but writes into ``out`` (same length, writable: ``data`` itself,
        in place, or a buffer apart from it): no fresh multi-MiB result to page-fault in."""
        self._run_into(data, sector, out, True)

    def decrypt_into(self, data: Buffer, sector: int, out: Buffer) -> None:
        """Like ``decrypt`` but writes into ``out``; same rules as ``encrypt_into``."""
        self._run_into(data, sector, out, False)

    def encrypt_segments(self, segments: Sequence[Buffer], sector: int) -> list[bytes]:
        """Encrypt a scatterlist: segments contiguous in sector space, starting at ``sector``.

        Each segment must hold whole data units (a multiple of ``sector_size``): a
        data unit never straddles two segments, as with dm-crypt's aligned bios.
        """
        return self._run_segments(segments, sector, encrypt=True)

    def decrypt_segments(self, segments: Sequence[Buffer], sector: int) -> list[bytes]:
        """Decrypt a scatterlist; same segment rules as ``encrypt_segments``."""
        return self._run_segments(segments, sector, encrypt=False)

    def wipe(self) -> None:
        """Forget the key (``dmsetup message ... key wipe``); later calls raise KeyNotSet."""
        self._key.wipe()
        for secret in (*self._subkeys, self._extra):
            zero(secret)
        self._subkeys = []
        if self._ivgen is not None:
            self._ivgen.wipe()
        self._ivgen = None
        self._wiped = True
        self._forget_contexts()

    def _forget_contexts(self) -> None:  # noqa: B027
        """Drop cached cipher contexts (subclasses hold them)."""

    def _check(self, size: int, sector: int) -> None:
        if self._wiped:
            raise KeyNotSet("the key of this crypt target was wiped")
        if size % self.sector_size:
            raise ValueError(f"data length {size} is not a multiple of sector_size")
        if sector < 0 or sector % (self.sector_size >> SECTOR_SHIFT):
            raise ValueError(f"sector {sector} is not aligned to sector_size")

    def _run(self, data: Buffer, sector: int, *, encrypt: bool) -> bytes:
        view = memoryview(data).cast("B")
        self._check(len(view), sector)
        if not len(view):
            return b""
        return self._convert(view, sector, encrypt)

    def _run_into(self, data: Buffer, sector: int, out: Buffer, encrypt: bool) -> None:
        # A flat byte view is taken as it is, and in place ``out`` is the same view: a new
        # view and its cast cost more than the test.
        if type(data) is memoryview and data.c_contiguous and data.ndim == 1 and data.format == "B":
            view = data
        else:
            view = memoryview(data).cast("B")
        target = view if out is data else memoryview(out).cast("B")
        size = self.sector_size
        nbytes = len(view)
        # The common valid shape, checked inline; ``_check`` names any fault.
        if self._wiped or nbytes % size or sector < 0 or sector % (size >> SECTOR_SHIFT):
            self._check(nbytes, sector)
        if target.readonly or len(target) != nbytes:
            raise ValueError("out must be a writable buffer of the same length as data")
        if nbytes:
            self._convert_into(view, sector, encrypt, target)

    def _convert_into(
        self, view: memoryview, sector: int, encrypt: bool, target: memoryview
    ) -> None:
        target[:] = self._convert(view, sector, encrypt)

    def _run_segments(
        self, segments: Sequence[Buffer], sector: int, *, encrypt: bool
    ) -> list[bytes]:
        views = [memoryview(segment).cast("B") for segment in segments]
        for view in views:
            self._check(len(view), sector)
        return self._convert_segments(views, sector, encrypt)

    def _convert_segments(self, views: list[memoryview], sector: int, encrypt: bool) -> list[bytes]:
        results = []
        for view in views:
            results.append(self._convert(view, sector, encrypt) if len(view) else b"")
            sector += len(view) >> SECTOR_SHIFT
        return results

    def _cc_sector(self, sector: int, unit: int) -> int:
        step = self.sector_size >> SECTOR_SHIFT
        return (sector + self.iv_offset + unit * step) & _MASK64

    def _iv_sector(self, cc_sector: int) -> int:
        return cc_sector >> self.sector_shift if self.iv_large_sectors else cc_sector

    @abstractmethod
    def _convert(self, view: memoryview, sector: int, encrypt: bool) -> bytes:
        """Transform whole, validated data units."""


class ReferenceTransform(CryptTransform):
    """One cipher request per data unit, exactly like ``crypt_convert_block_skcipher``."""

    def _convert(self, view: memoryview, sector: int, encrypt: bool) -> bytes:
        size = self.sector_size
        keycount = self.spec.keycount
        out = bytearray(len(view))
        for index, offset in enumerate(range(0, len(view), size)):
            cc_sector = self._cc_sector(sector, index)
            iv_sector = self._iv_sector(cc_sector)
            key_index = cc_sector & (keycount - 1)
            unit = bytearray(view[offset : offset + size])
            iv = b""
            if self._ivgen is not None:
                iv = self._ivgen.generator(iv_sector, key_index, unit, encrypt)
            result = bytearray(self._cipher_unit(key_index, iv, unit, encrypt))
            if self._ivgen is not None:
                self._ivgen.post(iv_sector, iv, result, encrypt)
            out[offset : offset + size] = result
        return bytes(out)

    def _cipher_unit(self, key_index: int, iv: bytes, unit: bytearray, encrypt: bool) -> bytes:
        spec = self.spec
        key = self._subkeys[key_index]
        if spec.chainmode == "xts" and _openssl_refuses_xts(spec.cipher, key):
            return _xts_unit_by_ecb(spec.cipher, key, iv, bytes(unit), encrypt)
        context = _ciphers.chained(spec.cipher, spec.chainmode, key, iv, encrypt=encrypt)
        return context.update(unit) + context.finalize()


def _openssl_refuses_xts(cipher: str, key: bytes | bytearray) -> bool:
    """OpenSSL's XTS is AES-only, 2x128/2x256-bit, with distinct halves (ADR 0002)."""
    half = len(key) // 2
    return cipher != "aes" or len(key) not in (32, 64) or key[:half] == key[half:]


def _xts_unit_by_ecb(
    cipher: str, key: bytes | bytearray, tweak: bytes, data: bytes, encrypt: bool
) -> bytes:
    """IEEE 1619 XTS for one data unit from ECB, for keys OpenSSL's XTS refuses."""
    half = len(key) // 2
    data_key, tweak_key = key[:half], key[half:]
    mask = int.from_bytes(_ciphers.ecb(cipher, tweak_key).update(tweak), "little")
    block_cipher = _ciphers.ecb(cipher, data_key, encrypt=encrypt)
    out = bytearray()
    for offset in range(0, len(data), 16):
        whitening = mask.to_bytes(16, "little")
        block = bytes(a ^ b for a, b in zip(data[offset : offset + 16], whitening, strict=True))
        block = block_cipher.update(block)
        out += bytes(a ^ b for a, b in zip(block, whitening, strict=True))
        mask = ((mask << 1) & ((1 << 128) - 1)) ^ (_XTS_POLY if mask >> 127 else 0)
    return bytes(out)


class _BulkState(threading.local):
    """Per-thread ECB contexts and scratch buffers: contexts are not thread-safe, and
    reusing scratch avoids page-faulting fresh multi-MiB buffers on every request."""

    def __init__(self) -> None:
        self.contexts: dict[tuple[str, int, bool], Any] = {}
        self.scratch: dict[str, U8] = {}


class BulkTransform(CryptTransform):
    """Whole requests in a few ECB calls per chunk; byte-identical to ``ReferenceTransform``."""

    def __init__(
        self,
        spec: CipherSpec,
        key: KeyMaterial,
        *,
        min_units: int = 0,
        chunk_bytes: int = CHUNK_BYTES,
        **geometry: Unpack[Geometry],
    ) -> None:
        if spec.ivmode in SECTOR_SIZE_512_ONLY_IV_MODES:
            raise CipherSpecError(f"IV mode {spec.ivmode} depends on the data: no bulk path")
        super().__init__(spec, key, **geometry)
        self._reference = ReferenceTransform(spec, key, **geometry)
        self._min_units = min_units
        self._units_per_chunk = max(1, chunk_bytes // self.sector_size)
        # cc_sector - cc_first of each unit of a chunk (uint64: the sum wraps like sector_t).
        step = self.sector_size >> SECTOR_SHIFT
        self._unit_steps = np.arange(self._units_per_chunk, dtype=np.uint64) * np.uint64(step)
        self._state = _BulkState()
        self._aes_cbc = spec.cipher == "aes" and spec.chainmode == "cbc"
        # aes-xts-plain64 (LUKS' default): IVs made in C, no numpy on a 4 KiB request, and
        # the AES key schedules expanded once here rather than on every request.
        xts_plain64 = (
            spec.cipher == "aes"
            and spec.chainmode == "xts"
            and spec.ivmode == "plain64"
            and spec.keycount == 1
        )
        self._xts_key = _native.XtsKey(self._subkeys[0]) if xts_plain64 else None
        # aes-cbc-essiv (LUKS1's default): the ESSIV IVs made inside the native CBC call, the
        # key's and the salt's schedules expanded once here.
        salt = (
            self._ivgen.aes_salt()
            if self._aes_cbc and isinstance(self._ivgen, EssivIv) and spec.keycount == 1
            else None
        )
        self._essiv_key = _native.EssivKey(self._subkeys[0], salt) if salt is not None else None

    def wipe(self) -> None:
        self._reference.wipe()
        if self._xts_key is not None:
            self._xts_key.wipe()
        if self._essiv_key is not None:
            self._essiv_key.wipe()
        super().wipe()

    def _forget_contexts(self) -> None:
        self._state = _BulkState()

    # -- plumbing ----------------------------------------------------------------------

    def _ecb(self, role: str, key_index: int, encrypt: bool) -> Any:
        """Reusable ECB context: role 'data' (or 'data' half of xts) / 'tweak' (xts K2)."""
        contexts = self._state.contexts
        slot = (role, key_index, encrypt)
        context = contexts.get(slot)
        if context is None:
            key = memoryview(self._subkeys[key_index])  # a view: wipe() zeroes what it sees
            if self.spec.chainmode == "xts":
                half = len(key) // 2
                key = key[half:] if role == "tweak" else key[:half]
            context = _ciphers.ecb(self.spec.cipher, key, encrypt=encrypt)
            contexts[slot] = context
        return context

    def _scratch(self, name: str, size: int) -> U8:
        """A reused byte buffer with ``block_size - 1`` spare bytes, as ``update_into`` needs."""
        buffers = self._state.scratch
        buffer = buffers.get(name)
        needed = size + 16
        if buffer is None or len(buffer) < needed:
            buffer = np.empty(max(needed, self._units_per_chunk * self.sector_size + 16), np.uint8)
            buffers[name] = buffer
        return buffer

    def _ecb_into(self, context: Any, source: npt.NDArray[Any], name: str) -> U8:
        """Run ``source`` through an ECB context into scratch ``name``; returns a view."""
        size = source.nbytes
        target = self._scratch(name, size)
        flat = np.ascontiguousarray(source).reshape(-1).view(np.uint8)
        if isinstance(context, _ciphers.NullContext):
            target[:size] = flat
        else:
            context.update_into(flat, target)
        return target[:size]

    # -- request -----------------------------------------------------------------------

    def _prefers_reference(self, units: int, encrypt: bool) -> bool:
        """Too small a request for the vectorized setup to pay off.

        CBC encryption without the native AES lanes loops once per block column of a
        unit: with large units it needs proportionally more units to win (measured
        crossover about a quarter of the blocks per unit: 64 units at 4096 B).
        """
        if units < self._min_units:
            return True
        if self._min_units and encrypt and self.spec.chainmode == "cbc" and not self._cbc_lanes():
            return units < self.sector_size // self.spec.block_size // 4
        return False

    def _convert(self, view: memoryview, sector: int, encrypt: bool) -> bytes:
        units = len(view) // self.sector_size
        if self._prefers_reference(units, encrypt):
            return self._reference._convert(view, sector, encrypt)
        # numpy-allocated (transparent huge pages for big arrays), then one copy out.
        out = np.empty(len(view), dtype=np.uint8)
        self._bulk(view, sector, encrypt, out)
        return out.tobytes()

    def _convert_into(
        self, view: memoryview, sector: int, encrypt: bool, target: memoryview
    ) -> None:
        if self._one_call(view, sector, encrypt, target):
            return
        units = len(view) // self.sector_size
        if self._prefers_reference(units, encrypt):
            target[:] = self._reference._convert(view, sector, encrypt)
            return
        self._bulk(view, sector, encrypt, np.frombuffer(target, dtype=np.uint8))

    def _one_call(self, view: memoryview, sector: int, encrypt: bool, target: Buffer | U8) -> bool:
        """aes-xts-plain64, or aes-cbc-essiv on a lane path, in one native call that makes the
        IVs; False for other specs, or where the IV sectors would wrap differently from
        consecutive steps (iv_large_sectors at the top of sector_t)."""
        xts_key, essiv_key = self._xts_key, self._essiv_key
        if xts_key is None and (essiv_key is None or not self._cbc_lanes()):
            return False
        size = self.sector_size
        step = size >> SECTOR_SHIFT
        first = (sector + self.iv_offset) & _MASK64  # _cc_sector(sector, 0)
        if self.iv_large_sectors:
            if first + (len(view) >> SECTOR_SHIFT) > _MASK64:
                return False
            first, step = first >> self.sector_shift, 1
        if xts_key is not None:
            _native.xts_plain64(target, view, first, step, xts_key, size, encrypt)
        elif essiv_key is not None:
            _native.cbc_essiv(target, view, first, step, essiv_key, None, size, encrypt)
        return True

    def _bulk(self, view: memoryview, sector: int, encrypt: bool, flat_out: U8) -> None:
        if self._one_call(view, sector, encrypt, flat_out):
            return
        size = self.sector_size
        units = len(view) // size
        source = np.frombuffer(view, dtype=np.uint8).reshape(units, size)
        out = flat_out.reshape(units, size)
        for first in range(0, units, self._units_per_chunk):
            last = min(units, first + self._units_per_chunk)
            cc_first = np.uint64(self._cc_sector(sector, first))
            cc_sectors = self._unit_steps[: last - first] + cc_first
            self._convert_chunk(source[first:last], out[first:last], cc_sectors, encrypt)

    def _convert_segments(self, views: list[memoryview], sector: int, encrypt: bool) -> list[bytes]:
        """Many small segments go through one vectorized call; big ones stay separate."""
        total = sum(len(view) for view in views)
        if len(views) <= 1 or total // len(views) >= self._units_per_chunk * self.sector_size:
            return super()._convert_segments(views, sector, encrypt)
        joined = self._convert(memoryview(b"".join(views)), sector, encrypt)
        results = []
        offset = 0
        for view in views:
            results.append(joined[offset : offset + len(view)])
            offset += len(view)
        return results

    def _convert_chunk(self, source: U8, out: U8, cc_sectors: U64, encrypt: bool) -> None:
        keycount = self.spec.keycount
        if self.iv_large_sectors:
            iv_sectors = cc_sectors >> np.uint64(self.sector_shift)
        else:
            iv_sectors = cc_sectors
        if keycount == 1:
            self._convert_units(source, out, iv_sectors, 0, encrypt)
            return
        key_indexes = cc_sectors & np.uint64(keycount - 1)
        for key_index in np.unique(key_indexes).tolist():
            rows = np.nonzero(key_indexes == key_index)[0]
            part = np.empty((len(rows), self.sector_size), dtype=np.uint8)
            self._convert_units(source[rows], part, iv_sectors[rows], int(key_index), encrypt)
            out[rows] = part

    def _convert_units(
        self, source: U8, out: U8, iv_sectors: U64, key_index: int, encrypt: bool
    ) -> None:
        chainmode = self.spec.chainmode
        if chainmode == "ecb":
            context = self._ecb("data", key_index, encrypt)
            out.reshape(-1)[:] = self._ecb_into(context, source, "ecb")
            return
        assert self._ivgen is not None
        ivs = self._ivgen.generate_many(iv_sectors, key_index)
        if chainmode == "xts":
            self._xts(source, out, ivs, key_index, encrypt)
        elif chainmode == "cbc" and encrypt:
            self._cbc_encrypt(source, out, ivs, key_index)
        elif chainmode == "cbc":
            self._cbc_decrypt(source, out, ivs, key_index)
        else:
            self._ctr(source, out, ivs, key_index)

    # -- modes -------------------------------------------------------------------------

    def _xts(self, source: U8, out: U8, ivs: U8, key_index: int, encrypt: bool) -> None:
        """``out = E(P ^ T) ^ T``.

        AES goes through one native call (the CPU's AES instructions, else OpenSSL's ECB
        from C, chunk by chunk in cache), in ``out`` itself: a 1 MiB request touches 2 MiB
        of memory, not 4. The other ciphers go through pyca's ECB between two native
        whitenings, via a reused scratch: pyca refuses an output that overlaps its input."""
        if self.spec.cipher == "aes":
            _native.xts(out, source, ivs, self._subkeys[key_index], self.sector_size, encrypt)
            return
        first = self._ecb_into(self._ecb("tweak", key_index, True), ivs, "tweak0")
        flat = out.reshape(-1)
        _native.whiten(flat, source, first, self.sector_size)
        crypted = self._ecb_into(self._ecb("data", key_index, encrypt), flat, "crypted")
        _native.whiten(flat, crypted, first, self.sector_size)

    def _cbc_lanes(self) -> bool:
        """AES-CBC in native lanes: the module's path, read per call (tests switch it)."""
        return self._aes_cbc and _native.path() != "openssl"

    def _cbc_decrypt(self, source: U8, out: U8, ivs: U8, key_index: int) -> None:
        if self._cbc_lanes():
            _native.cbc_decrypt(out, source, ivs, self._subkeys[key_index], self.sector_size)
            return
        block = self.spec.block_size
        decrypted = self._ecb_into(self._ecb("data", key_index, False), source, "crypted")
        decrypted2d = decrypted.reshape(len(source), self.sector_size)
        np.bitwise_xor(decrypted2d[:, block:], source[:, :-block], out=out[:, block:])
        np.bitwise_xor(decrypted2d[:, :block], ivs[:, :block], out=out[:, :block])

    def _cbc_encrypt(self, source: U8, out: U8, ivs: U8, key_index: int) -> None:
        # CBC is serial inside a unit but independent across units. AES: the units run in
        # parallel lanes in one native call (the module's path). Other ciphers: block column
        # j of every unit in one ECB call, on a column-major copy so each call is contiguous.
        if self._cbc_lanes():
            _native.cbc_encrypt(out, source, ivs, self._subkeys[key_index], self.sector_size)
            return
        block = self.spec.block_size
        units = len(source)
        columns = self.sector_size // block
        context = self._ecb("data", key_index, True)
        size = units * self.sector_size
        plain = self._scratch("columns", size)[:size].reshape(columns, units, block)
        plain[:] = source.reshape(units, columns, block).transpose(1, 0, 2)
        crypted = self._scratch("crypted", size)
        previous: U8 = ivs[:, :block]
        for column in range(columns):
            np.bitwise_xor(plain[column], previous, out=plain[column])
            offset = column * units * block
            context.update_into(plain[column].reshape(-1), crypted[offset:])
            previous = crypted[offset : offset + units * block].reshape(units, block)
        result = crypted[:size].reshape(columns, units, block).transpose(1, 0, 2)
        out.reshape(units, columns, block)[:] = result

    def _ctr(self, source: U8, out: U8, ivs: U8, key_index: int) -> None:
        # The kernel's ctr template increments the whole 16-byte IV as a big-endian counter.
        units = len(source)
        blocks = self.sector_size // 16
        high = ivs[:, :8].copy().view(">u8").reshape(units, 1).astype(np.uint64)
        low = ivs[:, 8:16].copy().view(">u8").reshape(units, 1).astype(np.uint64)
        counter_low = low + np.arange(blocks, dtype=np.uint64).reshape(1, blocks)
        counter_high = high + (counter_low < low).astype(np.uint64)
        counters = np.empty((units, blocks, 2), dtype=">u8")
        counters[:, :, 0] = counter_high
        counters[:, :, 1] = counter_low
        keystream = self._ecb_into(self._ecb("data", key_index, True), counters, "crypted")
        np.bitwise_xor(
            source.reshape(-1).view(np.uint64),
            keystream.view(np.uint64),
            out=out.reshape(-1).view(np.uint64),
        )


def make_transform(
    spec: CipherSpec, key: KeyMaterial, *, impl: Impl = "auto", **geometry: Unpack[Geometry]
) -> CryptTransform:
    """Build the transform of one crypt target.

    ``auto`` is the bulk path, falling back to per-unit calls for requests under
    ``AUTO_MIN_UNITS`` units and for the data-dependent IV modes lmk and tcw.
    """
    if impl == "reference" or (impl == "auto" and spec.ivmode in SECTOR_SIZE_512_ONLY_IV_MODES):
        return ReferenceTransform(spec, key, **geometry)
    if impl == "bulk":
        return BulkTransform(spec, key, **geometry)
    if impl == "auto":
        return BulkTransform(spec, key, min_units=AUTO_MIN_UNITS, **geometry)
    raise ValueError(f"unknown transform implementation {impl!r}")
