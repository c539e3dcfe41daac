"""luksFormat, luksOpen, luksAddKey, luksKillSlot and luksDump over a ``Disk``.

Every operation reads and checks the whole header before it writes anything, and
derives every key it needs before its first write: a refused request leaves the
device as it was. Header copies are written last (LUKS2: both, with a new
sequence id), after the keyslot material they point at. Key material lives in
``bytearray``s that are zeroed once used; the volume key leaves as ``KeyMaterial``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import uuid as uuid_module
from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal

from typing_extensions import Buffer

from app.crypto.keys import KeyMaterial, zero
from app.crypto.spec import parse_cipher_spec
from app.crypto.transform import make_transform
from app.luks import af
from app.luks.errors import KeyslotNotFound, LastKeyslot, LuksError, NoKeyAvailable
from app.luks.header import (
    AF_STRIPES,
    BINARY,
    KEYBLOCK,
    LUKS1_ACTIVE,
    LUKS1_DIGEST_SIZE,
    LUKS1_INACTIVE,
    LUKS1_KEYSLOTS,
    LUKS2_AREA_ALIGN,
    LUKS2_BINARY_SIZE,
    MAGIC,
    PHDR,
    SECONDARY_MAGIC,
    SECTOR,
    Digest,
    Disk,
    Header,
    Keyslot,
    check_cipher,
    read_header,
)
from app.luks.kdf import (
    ARGON2_MAX_PARALLEL,
    ARGON2_MIN_MEMORY_KIB,
    ARGON2_MIN_TIME,
    HASHES,
    MIN_PBKDF2_ITERATIONS,
    Kdf,
    KdfCeiling,
    KdfType,
    pbkdf2,
    pbkdf2_work,
    timed_argon2,
    timed_pbkdf2,
)

LUKS2_HDR_SIZE = 16384
LUKS2_DATA_OFFSET = 16 << 20
"""cryptsetup's LUKS2 default: 16 MiB of headers and keyslots before the data."""
LUKS1_ALIGN_SECTORS = 2048
"""cryptsetup's LUKS1 payload alignment (1 MiB)."""
DEFAULT_ARGON2_MEMORY_KIB = 1 << 20
DEFAULT_PBKDF2_ITERATIONS = 1_000_000
DIGEST_ITERATIONS = 100_000
SALT_BYTES = 32


@dataclass(frozen=True, slots=True)
class PbkdfOptions:
    """A new keyslot's PBKDF; None fields take fixed defaults, capped by the ceiling: PBKDF2
    1,000,000 iterations; Argon2 4 passes, 1 GiB, min(4, CPUs) threads. ``iter_time_ms``
    (cryptsetup's ``--iter-time``) instead times the derivation here and picks the
    iterations (PBKDF2), or the passes and, unless given, the memory (Argon2)."""

    type: KdfType | None = None
    hash: str = "sha256"
    iterations: int | None = None
    memory_kib: int | None = None
    parallel: int | None = None
    iter_time_ms: int | None = None

    def kdf(self, version: int, ceiling: KdfCeiling, key_bytes: int) -> Kdf:
        """The keyslot's KDF for a ``key_bytes`` key; timing it (``iter_time_ms``) costs
        about an eighth of that time, on the calling thread."""
        kind = self.type or ("argon2id" if version == 2 else "pbkdf2")
        if version == 1 and kind != "pbkdf2":
            raise LuksError("LUKS1 keyslots use pbkdf2 only")
        if self.hash not in HASHES:
            raise LuksError(f"unsupported hash {self.hash!r} (sha1, sha256, sha512)")
        if self.iter_time_ms is not None and self.iterations is not None:
            raise LuksError("give iterations or iter_time_ms, not both")
        salt = secrets.token_bytes(SALT_BYTES)
        if kind == "pbkdf2":
            if self.memory_kib is not None or self.parallel is not None:
                raise LuksError("memory_kib and parallel are Argon2 parameters")
            if self.iter_time_ms is not None:
                iterations = timed_pbkdf2(self.hash, key_bytes, self.iter_time_ms, ceiling)
            else:
                iterations = self.iterations or min(DEFAULT_PBKDF2_ITERATIONS, ceiling.iterations)
            if iterations < MIN_PBKDF2_ITERATIONS:
                raise LuksError(f"PBKDF2 iterations below {MIN_PBKDF2_ITERATIONS}")
            kdf = Kdf("pbkdf2", salt, hash=self.hash, iterations=iterations)
        else:
            time = self.iterations or ARGON2_MIN_TIME
            memory = self.memory_kib or min(DEFAULT_ARGON2_MEMORY_KIB, ceiling.memory_kib)
            parallel = self.parallel or min(ARGON2_MAX_PARALLEL, os.cpu_count() or 1)
            if time < ARGON2_MIN_TIME or memory < ARGON2_MIN_MEMORY_KIB:
                raise LuksError(
                    f"Argon2 needs iterations >= {ARGON2_MIN_TIME} and memory_kib >= "
                    f"{ARGON2_MIN_MEMORY_KIB}"
                )
            # Refused before timing too: the benchmark itself needs 8 KiB per thread.
            Kdf(kind, salt, time=time, memory_kib=memory, parallel=parallel).check(ceiling)
            if self.iter_time_ms is not None:
                time, memory = timed_argon2(
                    kind,
                    key_bytes,
                    self.iter_time_ms,
                    memory,
                    parallel,
                    ceiling,
                    memory_fixed=self.memory_kib is not None,
                )
            kdf = Kdf(kind, salt, time=time, memory_kib=memory, parallel=parallel)
        kdf.check(ceiling)
        return kdf


@dataclass(frozen=True, slots=True)
class FormatOptions:
    type: Literal["luks1", "luks2"] = "luks2"
    cipher: str = "aes-xts-plain64"
    key_size: int = 512
    """Bits, as cryptsetup's ``--key-size``."""
    sector_size: int = 512
    pbkdf: PbkdfOptions = PbkdfOptions()
    label: str = ""


# ---------------------------------------------------------------------------- keyslot crypto


def _crypt_area(cipher: str, key: Buffer, data: Buffer, *, encrypt: bool) -> bytes:
    """A keyslot area through its cipher: 512-byte units, IVs counted from the area's start."""
    material = KeyMaterial(key)
    transform = make_transform(parse_cipher_spec(cipher), material, impl="reference")
    try:
        return transform.encrypt(data, 0) if encrypt else transform.decrypt(data, 0)
    finally:
        transform.wipe()
        material.wipe()


def _material_size(key_size: int, stripes: int) -> int:
    return -(-key_size * stripes // SECTOR) * SECTOR


def _digest_of(key: Buffer, digest: Digest) -> bytes:
    return pbkdf2(digest.hash, key, digest.salt, digest.iterations, len(digest.value))


def _try_slot(
    disk: Disk, header: Header, slot: Keyslot, passphrase: Buffer, ceiling: KdfCeiling
) -> bytearray | None:
    """The volume key if ``passphrase`` opens ``slot`` (None otherwise, after the same work)."""
    derived = slot.kdf.derive(passphrase, slot.area_key_size, ceiling)
    size = _material_size(slot.key_size, slot.stripes)
    encrypted = disk.read(slot.offset, size)
    material = bytearray(_crypt_area(slot.cipher, derived, encrypted, encrypt=False))
    zero(derived)
    key = af.merge(material, slot.key_size, slot.stripes, slot.af_hash)
    zero(material)
    if hmac.compare_digest(_digest_of(key, header.digest), header.digest.value):
        return key
    zero(key)
    return None


def _candidates(keyslots: dict[int, Keyslot]) -> list[tuple[int, Keyslot]]:
    """The keyslots a passphrase is tried on, in cryptsetup's order: by priority, then
    number; priority 0 (ignore) never."""
    return sorted(
        (item for item in keyslots.items() if item[1].priority > 0),
        key=lambda item: (-item[1].priority, item[0]),
    )


def unlock_work(slots: Iterable[Keyslot], digest: Digest) -> int:
    """Work units (``app.luks.kdf``) of trying ``slots``: each one's KDF, and the digest
    checked after each, as a wrong passphrase makes ``unlock`` do."""
    per_try = pbkdf2_work(digest.hash, digest.iterations, len(digest.value))
    return sum(slot.kdf.work(slot.area_key_size) + per_try for slot in slots)


def check_unlock_work(slots: Collection[Keyslot], digest: Digest, ceiling: KdfCeiling) -> None:
    """Refuse, before any derivation, an unlock of ``slots`` costing more than the ceiling:
    32 keyslots, each within the per-keyslot ceilings, would still cost an hour."""
    work = unlock_work(slots, digest)
    if work > ceiling.unlock_work:
        raise LuksError(
            f"unlocking tries {len(slots)} keyslot(s) and the digest after each: {work:,} "
            f"units of key-derivation work, over the ceiling of {ceiling.unlock_work:,} "
            "(REQCRYPT_LUKS_MAX_UNLOCK_WORK)"
        )


def unlock(
    disk: Disk, passphrase: Buffer, ceiling: KdfCeiling, *, header: Header | None = None
) -> tuple[Header, bytearray, int]:
    """The header, volume key and keyslot ``passphrase`` opens; slots by priority, as cryptsetup.
    The work of trying them all is checked against the ceiling first."""
    header = header or read_header(disk, ceiling)
    order = _candidates(header.keyslots)
    check_unlock_work([slot for _, slot in order], header.digest, ceiling)
    for number, slot in order:
        key = _try_slot(disk, header, slot, passphrase, ceiling)
        if key is not None:
            return header, key, number
    raise NoKeyAvailable()


# ---------------------------------------------------------------------------- writing


def _luks1_bytes(header: Header) -> bytes:
    name, _, mode = header.cipher.partition("-")
    out = bytearray(
        PHDR.pack(
            MAGIC,
            1,
            name.encode(),
            mode.encode(),
            header.hash.encode(),
            header.data_offset // SECTOR,
            header.key_size,
            header.digest.value,
            header.digest.salt,
            header.digest.iterations,
            header.uuid.encode(),
        )
    )
    for number in range(LUKS1_KEYSLOTS):
        slot = header.keyslots.get(number)
        offset = header.slot_offsets[number] // SECTOR
        if slot is None:
            out += KEYBLOCK.pack(LUKS1_INACTIVE, 0, bytes(32), offset, AF_STRIPES)
        else:
            out += KEYBLOCK.pack(
                LUKS1_ACTIVE, slot.kdf.iterations, slot.kdf.salt, offset, slot.stripes
            )
    return bytes(out)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _kdf_json(kdf: Kdf) -> dict[str, Any]:
    if kdf.type == "pbkdf2":
        return {
            "type": "pbkdf2",
            "hash": kdf.hash,
            "iterations": kdf.iterations,
            "salt": _b64(kdf.salt),
        }
    return {
        "type": kdf.type,
        "time": kdf.time,
        "memory": kdf.memory_kib,
        "cpus": kdf.parallel,
        "salt": _b64(kdf.salt),
    }


def _keyslot_json(slot: Keyslot) -> dict[str, Any]:
    document: dict[str, Any] = {
        "type": "luks2",
        "key_size": slot.key_size,
        "af": {"type": "luks1", "stripes": slot.stripes, "hash": slot.af_hash},
        "area": {
            "type": "raw",
            "offset": str(slot.offset),
            "size": str(slot.size),
            "encryption": slot.cipher,
            "key_size": slot.area_key_size,
        },
        "kdf": _kdf_json(slot.kdf),
    }
    if slot.priority != 1:
        document["priority"] = slot.priority
    return document


def _luks2_copy(header: Header, offset: int, area: bytes) -> bytes:
    binary = bytearray(
        BINARY.pack(
            MAGIC if offset == 0 else SECONDARY_MAGIC,
            2,
            header.hdr_size,
            header.seqid,
            header.label.encode(),
            b"sha256",
            secrets.token_bytes(64),
            header.uuid.encode(),
            header.subsystem.encode(),
            offset,
            bytes(184),
            bytes(64),
        )
    )
    binary += bytes(LUKS2_BINARY_SIZE - len(binary))
    whole = binary + area
    whole[448:480] = hashlib.sha256(whole).digest()
    return bytes(whole)


def write_header(disk: Disk, header: Header) -> None:
    """Both LUKS2 copies (sequence id + 1) or the LUKS1 phdr, then a flush."""
    if header.version == 1:
        raw = _luks1_bytes(header)
        disk.write(0, raw + bytes(-len(raw) % SECTOR))
        disk.flush()
        return
    text = json.dumps(header.metadata, separators=(",", ":")).encode()
    json_size = header.hdr_size - LUKS2_BINARY_SIZE
    if len(text) >= json_size:
        raise LuksError(f"metadata needs {len(text)} bytes; the JSON area holds {json_size - 1}")
    area = text + bytes(json_size - len(text))
    header.seqid += 1
    disk.write(0, _luks2_copy(header, 0, area))
    disk.write(header.hdr_size, _luks2_copy(header, header.hdr_size, area))
    disk.flush()


def _store_keyslot(
    disk: Disk,
    header: Header,
    number: int,
    slot: Keyslot,
    key: Buffer,
    passphrase: Buffer,
    ceiling: KdfCeiling,
) -> None:
    """Encrypt ``key``'s AF material into the slot's area and enter the slot in the header."""
    derived = slot.kdf.derive(passphrase, slot.area_key_size, ceiling)
    material = af.split(key, slot.stripes, slot.af_hash)
    material += bytes(_material_size(slot.key_size, slot.stripes) - len(material))
    encrypted = _crypt_area(slot.cipher, derived, material, encrypt=True)
    zero(derived)
    zero(material)
    disk.write(slot.offset, encrypted)
    header.keyslots[number] = slot
    if header.version == 2:
        header.metadata["keyslots"][str(number)] = _keyslot_json(slot)
        digest = header.metadata["digests"][header.digest_id]
        digest["keyslots"] = sorted({*digest["keyslots"], str(number)}, key=int)


def _wipe(disk: Disk, offset: int, length: int) -> None:
    chunk = 1 << 20
    for start in range(offset, offset + length, chunk):
        disk.write(start, bytes(min(chunk, offset + length - start)))


def format_device(
    disk: Disk, passphrase: Buffer, options: FormatOptions, ceiling: KdfCeiling
) -> tuple[Header, KeyMaterial]:
    """luksFormat: a new volume key, keyslot 0 for ``passphrase``. Everything is checked
    before the first write; then the old header area is zeroed and the new one written."""
    if options.key_size % 8:
        raise LuksError("key_size is in bits and must be a multiple of 8")
    key_bytes = options.key_size // 8
    check_cipher(options.cipher, key_bytes, "format")
    if options.sector_size not in (512, 1024, 2048, 4096):
        raise LuksError("sector_size must be 512, 1024, 2048 or 4096")
    if len(options.label.encode()) > 47 or not options.label.isprintable():
        raise LuksError("label must be at most 47 printable bytes")
    version: Literal[1, 2] = 2 if options.type == "luks2" else 1
    if version == 1 and options.sector_size != 512:
        raise LuksError("LUKS1 encrypts 512-byte sectors only (use luks2 for larger)")
    if version == 1 and options.label:
        raise LuksError("LUKS1 headers have no label")
    name, _, mode = options.cipher.partition("-")
    if version == 1 and (options.cipher.startswith("capi:") or len(name) > 31 or len(mode) > 31):
        raise LuksError("LUKS1 names a cipher as cipher-chainmode-ivmode, up to 31 characters each")
    kdf = options.pbkdf.kdf(version, ceiling, key_bytes)
    area_size = _material_size(key_bytes, AF_STRIPES)
    if version == 1:
        area_sectors = -(-area_size // 4096) * 8
        first = 8
        offsets = tuple((first + slot * area_sectors) * SECTOR for slot in range(LUKS1_KEYSLOTS))
        end = first + LUKS1_KEYSLOTS * area_sectors
        data_offset = -(-end // LUKS1_ALIGN_SECTORS) * LUKS1_ALIGN_SECTORS * SECTOR
        area_size = area_sectors * SECTOR
    else:
        offsets = ()
        data_offset = LUKS2_DATA_OFFSET
        area_size = -(-area_size // LUKS2_AREA_ALIGN) * LUKS2_AREA_ALIGN
    if disk.size < data_offset + options.sector_size:
        raise LuksError(
            f"device of {disk.size} bytes is too small: the header takes {data_offset} bytes"
        )
    if kdf.type == "pbkdf2":
        digest_iterations = max(MIN_PBKDF2_ITERATIONS, kdf.iterations // 8)
    else:
        digest_iterations = DIGEST_ITERATIONS
    digest_iterations = min(digest_iterations, ceiling.iterations)
    digest_hash = options.pbkdf.hash
    slot = Keyslot(
        key_bytes,
        kdf,
        offsets[0] if version == 1 else 2 * LUKS2_HDR_SIZE,
        area_size,
        options.cipher,
        key_bytes,
        AF_STRIPES,
        digest_hash,
    )
    salt = secrets.token_bytes(SALT_BYTES)
    digest_size = LUKS1_DIGEST_SIZE if version == 1 else hashlib.new(digest_hash).digest_size
    digest = Digest(digest_hash, digest_iterations, salt, bytes(digest_size))
    check_unlock_work([slot], digest, ceiling)  # a header made here must open here
    key = bytearray(secrets.token_bytes(key_bytes))
    digest.value = pbkdf2(digest_hash, key, salt, digest_iterations, digest_size)
    header = Header(
        version=version,
        uuid=str(uuid_module.uuid4()),
        cipher=options.cipher,
        key_size=key_bytes,
        data_offset=data_offset,
        digest=digest,
        keyslots={},
        sector_size=options.sector_size,
        label=options.label,
        hash=digest_hash,
        slot_offsets=offsets,
        hdr_size=LUKS2_HDR_SIZE if version == 2 else 0,
        keyslots_size=data_offset - 2 * LUKS2_HDR_SIZE if version == 2 else 0,
    )
    if version == 2:
        header.metadata = {
            "keyslots": {},
            "tokens": {},
            "segments": {
                "0": {
                    "type": "crypt",
                    "offset": str(data_offset),
                    "size": "dynamic",
                    "iv_tweak": "0",
                    "encryption": options.cipher,
                    "sector_size": options.sector_size,
                }
            },
            "digests": {
                "0": {
                    "type": "pbkdf2",
                    "keyslots": [],
                    "segments": ["0"],
                    "hash": digest_hash,
                    "iterations": digest_iterations,
                    "salt": _b64(salt),
                    "digest": _b64(digest.value),
                }
            },
            "config": {
                "json_size": str(LUKS2_HDR_SIZE - LUKS2_BINARY_SIZE),
                "keyslots_size": str(header.keyslots_size),
            },
        }
    try:
        _wipe(disk, 0, data_offset)
        _store_keyslot(disk, header, 0, slot, key, passphrase, ceiling)
        write_header(disk, header)
        return header, KeyMaterial(key)
    finally:
        zero(key)


def _free_area(header: Header, size: int) -> int:
    """LUKS2: the lowest aligned gap in the keyslots area that holds ``size`` bytes."""
    start = 2 * header.hdr_size
    end = start + header.keyslots_size
    areas = sorted(  # every keyslot's, also those of unbound keys the header keeps
        (int(slot["area"]["offset"]), int(slot["area"]["size"]))
        for slot in header.metadata["keyslots"].values()
    )
    for offset, length in areas:
        if offset - start >= size:
            break
        start = max(start, -(-(offset + length) // LUKS2_AREA_ALIGN) * LUKS2_AREA_ALIGN)
    if start + size > end:
        raise LuksError("no room left in the keyslots area")
    return start


def add_key(
    disk: Disk,
    passphrase: Buffer,
    new_passphrase: Buffer,
    pbkdf: PbkdfOptions,
    ceiling: KdfCeiling,
) -> tuple[Header, int]:
    """luksAddKey: the lowest free keyslot opens with ``new_passphrase`` too."""
    header, key, _ = unlock(disk, passphrase, ceiling)
    try:
        taken = set(header.keyslots) | {int(n) for n in header.metadata.get("keyslots", {})}
        free = [n for n in range(header.max_keyslots) if n not in taken]
        if not free:
            raise LuksError(f"all {header.max_keyslots} keyslots are in use")
        number = free[0]
        if header.version == 1:
            kdf = replace(pbkdf, hash=header.hash).kdf(1, ceiling, header.key_size)
            size = _material_size(header.key_size, AF_STRIPES)
            slot = Keyslot(
                header.key_size,
                kdf,
                header.slot_offsets[number],
                size,
                header.cipher,
                header.key_size,
                AF_STRIPES,
                header.hash,
            )
        else:
            kdf = pbkdf.kdf(2, ceiling, header.key_size)
            size = -(-_material_size(header.key_size, AF_STRIPES) // LUKS2_AREA_ALIGN)
            size *= LUKS2_AREA_ALIGN
            model = next(iter(header.keyslots.values()), None)
            cipher = model.cipher if model else header.cipher
            area_key = model.area_key_size if model else header.key_size
            slot = Keyslot(
                header.key_size,
                kdf,
                _free_area(header, size),
                size,
                cipher,
                area_key,
                AF_STRIPES,
                model.af_hash if model else "sha256",
            )
        after = _candidates({**header.keyslots, number: slot})
        check_unlock_work([kept for _, kept in after], header.digest, ceiling)
        _store_keyslot(disk, header, number, slot, key, new_passphrase, ceiling)
        write_header(disk, header)
        return header, number
    finally:
        zero(key)


def kill_slot(
    disk: Disk, slot: int, passphrase: Buffer | None, ceiling: KdfCeiling, *, force: bool
) -> Header:
    """luksKillSlot: ``passphrase`` must open another keyslot; the last one goes only with
    ``force`` (then no passphrase is asked: the data becomes unreadable for good)."""
    header = read_header(disk, ceiling)
    if slot not in header.keyslots:
        raise KeyslotNotFound(f"keyslot {slot} is not in use")
    others = {n: s for n, s in header.keyslots.items() if n != slot}
    if not others:
        if not force:
            raise LastKeyslot(
                f"keyslot {slot} is the last one: killing it makes the data unreadable "
                "(force to do it anyway)"
            )
    else:
        if passphrase is None:
            raise LuksError("a passphrase of another keyslot is needed")
        remaining = replace(header, keyslots=others)
        _, key, _ = unlock(disk, passphrase, ceiling, header=remaining)
        zero(key)
    victim = header.keyslots.pop(slot)
    if header.version == 2:
        del header.metadata["keyslots"][str(slot)]
        for section in ("digests", "tokens"):
            for item in header.metadata[section].values():
                if str(slot) in item.get("keyslots", []):
                    item["keyslots"] = [k for k in item["keyslots"] if k != str(slot)]
    write_header(disk, header)
    disk.write(victim.offset, secrets.token_bytes(_material_size(victim.key_size, victim.stripes)))
    disk.flush()
    return header


# ---------------------------------------------------------------------------- views


def data_sectors(header: Header, device_size: int) -> int:
    """512-byte sectors of the data segment, whole data units only."""
    size = header.data_size if header.data_size is not None else device_size - header.data_offset
    size -= size % header.sector_size
    if size <= 0:
        raise LuksError("the device has no room for data after the LUKS header")
    return size // SECTOR


PERSISTENT_FLAGS = {
    "allow-discards": "allow_discards",
    "same-cpu-crypt": "same_cpu_crypt",
    "submit-from-crypt-cpus": "submit_from_crypt_cpus",
    "no-read-workqueue": "no_read_workqueue",
    "no-write-workqueue": "no_write_workqueue",
}
"""LUKS2 ``config.flags`` that ``cryptsetup open`` turns into crypt options."""


def table_line(
    header: Header, key: KeyMaterial, device: str, device_size: int, *, allow_discards: bool
) -> str:
    """The crypt line ``cryptsetup open`` maps for this header and volume key: the
    header's persistent flags and ``allow_discards`` if asked, in the kernel's order."""
    flags = {PERSISTENT_FLAGS[f] for f in header.flags if f in PERSISTENT_FLAGS}
    if allow_discards:
        flags.add("allow_discards")
    options = [option for option in PERSISTENT_FLAGS.values() if option in flags]
    if header.sector_size != SECTOR:
        options.append(f"sector_size:{header.sector_size}")
    line = (
        f"0 {data_sectors(header, device_size)} crypt {header.cipher} {key.hex()} "
        f"{header.iv_tweak} {device} {header.data_offset // SECTOR}"
    )
    return f"{line} {len(options)} {' '.join(options)}" if options else line


def open_table(
    disk: Disk,
    passphrase: Buffer,
    ceiling: KdfCeiling,
    device: str,
    *,
    allow_discards: bool,
) -> str:
    """luksOpen: the crypt line for the volume key ``passphrase`` unlocks on ``disk``."""
    header, key, _ = unlock(disk, passphrase, ceiling)
    material = KeyMaterial(key)
    zero(key)
    try:
        return table_line(header, material, device, disk.size, allow_discards=allow_discards)
    finally:
        material.wipe()


def forget(secret: bytearray | None) -> None:
    """Zero a passphrase or key once used (what Python allows: the bytearray, not copies)."""
    if secret is not None:
        zero(secret)


def dump(header: Header, device_size: int) -> dict[str, Any]:
    """luksDump as JSON: everything but salts, digests and key material."""

    def kdf_out(kdf: Kdf) -> dict[str, Any]:
        if kdf.type == "pbkdf2":
            return {"type": "pbkdf2", "hash": kdf.hash, "iterations": kdf.iterations}
        return {
            "type": kdf.type,
            "iterations": kdf.time,
            "memory_kib": kdf.memory_kib,
            "parallel": kdf.parallel,
        }

    size = header.data_size
    data_length = size if size is not None else max(0, device_size - header.data_offset)
    data_length -= data_length % header.sector_size
    tokens = header.metadata.get("tokens", {}) if header.version == 2 else {}
    return {
        "version": header.version,
        "uuid": header.uuid,
        "label": header.label,
        "subsystem": header.subsystem,
        "cipher": header.cipher,
        "key_size": header.key_size * 8,
        "sector_size": header.sector_size,
        "data_offset": header.data_offset,
        "data_length": data_length,
        "epoch": header.seqid if header.version == 2 else None,
        "metadata_size": header.hdr_size or None,
        "keyslots_size": header.keyslots_size or None,
        "header_copy": header.copy,
        "flags": list(header.flags),
        "keyslots": [
            {
                "slot": number,
                "key_size": slot.key_size * 8,
                "cipher": slot.cipher,
                "priority": slot.priority,
                "pbkdf": kdf_out(slot.kdf),
                "af_stripes": slot.stripes,
                "af_hash": slot.af_hash,
                "area_offset": slot.offset,
                "area_size": slot.size,
            }
            for number, slot in sorted(header.keyslots.items())
        ],
        "digest": {
            "type": "pbkdf2",
            "hash": header.digest.hash,
            "iterations": header.digest.iterations,
        },
        "tokens": [
            {"id": int(tid), "type": token["type"], "keyslots": [int(k) for k in token["keyslots"]]}
            for tid, token in sorted(tokens.items(), key=lambda item: int(item[0]))
        ],
    }
