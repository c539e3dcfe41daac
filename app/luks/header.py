"""LUKS1 and LUKS2 on-disk headers: strict parsing into ``Header``, and serialization.

LUKS1: one 592-byte big-endian ``phdr`` at offset 0 with eight fixed keyslots.
LUKS2: a 4096-byte binary header followed by a JSON area, the pair (``hdr_size``
bytes) written twice, at 0 and at ``hdr_size``; each copy carries a checksum over
itself with the checksum field zeroed, and a sequence id. The newest copy whose
checksum and JSON both hold is used, as cryptsetup does: a corrupt primary falls
back to the secondary. Every JSON field is checked for type, range and layout
before anything uses it; what reqcrypt cannot honour (a mandatory requirement,
reencryption, integrity) is refused, never ignored.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import struct
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from typing_extensions import Buffer

from app.crypto.spec import parse_cipher_spec
from app.errors import CipherSpecError
from app.luks.errors import LuksError, NotLuks
from app.luks.kdf import HASHES, Kdf, KdfCeiling

SECTOR = 512
MAGIC = b"LUKS\xba\xbe"
SECONDARY_MAGIC = b"SKUL\xba\xbe"
LUKS2_BINARY_SIZE = 4096
LUKS2_HDR_SIZES = tuple(16384 << shift for shift in range(9))
"""hdr_size (binary header + JSON area): 16 KiB to 4 MiB, powers of two."""
LUKS2_AREA_ALIGN = 4096
AF_STRIPES = 4000
LUKS1_KEYSLOTS = 8
LUKS2_MAX_KEYSLOTS = 32
LUKS1_ACTIVE = 0x00AC71F3
LUKS1_INACTIVE = 0x0000DEAD
LUKS1_DIGEST_SIZE = 20
SECTOR_SIZES = (512, 1024, 2048, 4096)
MAX_KEY_BYTES = 128

PHDR = struct.Struct(">6sH32s32s32sII20s32sI40s")
KEYBLOCK = struct.Struct(">II32sII")
BINARY = struct.Struct(">6sHQQ48s32s64s40s48sQ184s64s")
_UINT_TEXT = re.compile(r"^(0|[1-9][0-9]{0,19})$")
_ID = re.compile(r"^(0|[1-9][0-9]{0,2})$")


class Disk(Protocol):
    """What LUKS needs of a backing device (``BackingStore`` is one); sector-aligned I/O."""

    @property
    def size(self) -> int: ...

    def read(self, offset: int, length: int) -> bytearray: ...

    def write(self, offset: int, data: Buffer) -> None: ...

    def flush(self) -> None: ...


@dataclass(slots=True)
class Keyslot:
    key_size: int
    kdf: Kdf
    offset: int
    """Bytes from the device start to the keyslot's encrypted AF material."""
    size: int
    cipher: str
    """The cipher of the keyslot area (512-byte units, IVs from 0 at ``offset``)."""
    area_key_size: int
    stripes: int
    af_hash: str
    priority: int = 1
    """LUKS2: 0 ignore (never tried by passphrase), 1 normal, 2 preferred."""


@dataclass(slots=True)
class Digest:
    hash: str
    iterations: int
    salt: bytes
    value: bytes


@dataclass(slots=True)
class Header:
    version: Literal[1, 2]
    uuid: str
    cipher: str
    key_size: int
    data_offset: int
    """Bytes: where the encrypted data segment starts."""
    digest: Digest
    keyslots: dict[int, Keyslot]
    sector_size: int = 512
    data_size: int | None = None
    """Bytes of the segment; None: to the end of the device (``"dynamic"``)."""
    iv_tweak: int = 0
    label: str = ""
    subsystem: str = ""
    hash: str = "sha256"
    """LUKS1's hashSpec: its PBKDF2 and AF hash."""
    slot_offsets: tuple[int, ...] = ()
    """LUKS1: each slot's fixed key material offset (bytes), used or not."""
    hdr_size: int = 0
    seqid: int = 0
    keyslots_size: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    """LUKS2: the JSON document as read; rewritten on change, tokens kept verbatim."""
    digest_id: str = "0"
    flags: tuple[str, ...] = ()
    """LUKS2 persistent activation flags (``config.flags``), e.g. allow-discards."""
    copy: Literal["primary", "secondary"] = "primary"

    @property
    def max_keyslots(self) -> int:
        return LUKS1_KEYSLOTS if self.version == 1 else LUKS2_MAX_KEYSLOTS


# ---------------------------------------------------------------------------- reading


def _text(raw: bytes, what: str) -> str:
    """A NUL-terminated ASCII field."""
    value = raw.split(b"\0", 1)[0]
    try:
        text = value.decode("ascii")
    except UnicodeDecodeError:
        raise LuksError(f"{what} is not ASCII") from None
    if not text.isprintable():
        raise LuksError(f"{what} has control characters")
    return text


def check_cipher(cipher: str, key_size: int, what: str) -> None:
    """A cipher and key size the crypt target maps (reqcrypt's own table grammar decides)."""
    if not 1 <= key_size <= MAX_KEY_BYTES:
        raise LuksError(f"{what} key size {key_size} bytes outside 1..{MAX_KEY_BYTES}")
    try:
        parse_cipher_spec(cipher).check_key(bytes(key_size))
    except CipherSpecError as exc:
        raise LuksError(f"{what} cipher {cipher!r}: {exc.detail}") from None


def read_header(disk: Disk, ceiling: KdfCeiling) -> Header:
    """The device's LUKS header, checked in full. ``NotLuks`` when there is none at all."""
    if disk.size < LUKS2_BINARY_SIZE:
        raise NotLuks("the device holds no LUKS header (smaller than one)")
    first = bytes(disk.read(0, LUKS2_BINARY_SIZE))
    if first[:6] == MAGIC and struct.unpack(">H", first[6:8])[0] == 1:
        return _parse_luks1(first, disk.size, ceiling)
    return _read_luks2(disk, first, ceiling)


def _parse_luks1(raw: bytes, device_size: int, ceiling: KdfCeiling) -> Header:
    (_, _, name, mode, hash_spec, payload, key_bytes, mk_digest, mk_salt, mk_iterations, uuid) = (
        PHDR.unpack_from(raw)
    )
    hash_name = _text(hash_spec, "hashSpec")
    if hash_name not in HASHES:
        raise LuksError(f"unsupported LUKS1 hash {hash_name!r} (sha1, sha256, sha512)")
    cipher = f"{_text(name, 'cipherName')}-{_text(mode, 'cipherMode')}"
    check_cipher(cipher, key_bytes, "LUKS1")
    data_offset = payload * SECTOR
    if data_offset > device_size:
        raise LuksError(f"payload offset {payload} sectors is beyond the device")
    digest = Digest(hash_name, mk_iterations, mk_salt, mk_digest)
    Kdf("pbkdf2", mk_salt, hash=hash_name, iterations=mk_iterations).check(ceiling)
    keyslots: dict[int, Keyslot] = {}
    offsets = []
    material = -(-key_bytes * AF_STRIPES // SECTOR) * SECTOR
    for slot in range(LUKS1_KEYSLOTS):
        active, iterations, salt, offset, stripes = KEYBLOCK.unpack_from(
            raw, PHDR.size + slot * KEYBLOCK.size
        )
        offset *= SECTOR
        offsets.append(offset)
        if active == LUKS1_INACTIVE:
            continue
        if active != LUKS1_ACTIVE:
            raise LuksError(f"keyslot {slot}: state {active:#x} is neither enabled nor disabled")
        if stripes != AF_STRIPES:
            raise LuksError(f"keyslot {slot}: {stripes} AF stripes (LUKS1 uses {AF_STRIPES})")
        if offset < PHDR.size + LUKS1_KEYSLOTS * KEYBLOCK.size or offset + material > data_offset:
            raise LuksError(f"keyslot {slot}: key material outside the header area")
        kdf = Kdf("pbkdf2", salt, hash=hash_name, iterations=iterations)
        kdf.check(ceiling)
        keyslots[slot] = Keyslot(
            key_bytes, kdf, offset, material, cipher, key_bytes, stripes, hash_name
        )
    return Header(
        version=1,
        uuid=_text(uuid, "uuid"),
        cipher=cipher,
        key_size=key_bytes,
        data_offset=data_offset,
        digest=digest,
        keyslots=keyslots,
        hash=hash_name,
        slot_offsets=tuple(offsets),
    )


def _read_luks2(disk: Disk, first: bytes, ceiling: KdfCeiling) -> Header:
    """The newest valid copy; the primary's error when neither holds."""
    errors: list[str] = []
    copies: list[Header] = []
    candidates = list(LUKS2_HDR_SIZES)
    if first[:6] == MAGIC:
        try:
            copies.append(_parse_luks2(disk, 0, first, ceiling))
            candidates = [copies[0].hdr_size]
        except LuksError as exc:  # its hdr_size may be what is corrupt: look everywhere
            errors.append(f"primary header: {exc.detail}")
    for offset in candidates:
        if offset + LUKS2_BINARY_SIZE > disk.size:
            break
        raw = bytes(disk.read(offset, LUKS2_BINARY_SIZE))
        if raw[:6] != SECONDARY_MAGIC:
            continue
        try:
            copies.append(_parse_luks2(disk, offset, raw, ceiling))
        except LuksError as exc:
            errors.append(f"secondary header: {exc.detail}")
        break
    if copies:
        return max(copies, key=lambda header: (header.seqid, header.copy == "primary"))
    if not errors:
        raise NotLuks("the device holds no LUKS header")
    raise LuksError("; ".join(errors))


def _binary_size(raw: bytes, offset: int) -> int:
    version = struct.unpack(">H", raw[6:8])[0]
    if version != 2:
        raise LuksError(f"version {version} (LUKS2 expected)")
    fields = BINARY.unpack_from(raw)
    hdr_size, hdr_offset = fields[2], fields[9]
    if hdr_size not in LUKS2_HDR_SIZES:
        raise LuksError(f"hdr_size {hdr_size} is not one of 16 KiB..4 MiB (powers of two)")
    if hdr_offset != offset:
        raise LuksError(f"hdr_offset {hdr_offset} does not match where the copy lies ({offset})")
    return int(hdr_size)


def _parse_luks2(disk: Disk, offset: int, raw: bytes, ceiling: KdfCeiling) -> Header:
    hdr_size = _binary_size(raw, offset)
    (_, _, _, seqid, label, checksum_alg, _, uuid, subsystem, _, _, csum) = BINARY.unpack_from(raw)
    if offset + 2 * hdr_size > disk.size and offset == 0:
        raise LuksError("device is smaller than both header copies")
    if offset + hdr_size > disk.size:
        raise LuksError("header runs past the end of the device")
    algorithm = _text(checksum_alg, "checksum_alg")
    if algorithm not in HASHES:
        raise LuksError(f"unsupported checksum algorithm {algorithm!r}")
    whole = bytearray(disk.read(offset, hdr_size))
    whole[448:512] = bytes(64)
    digest = hashlib.new(algorithm, whole).digest()
    if not hmac.compare_digest(digest, csum[: len(digest)]):
        raise LuksError("checksum mismatch")
    area = bytes(whole[LUKS2_BINARY_SIZE:])
    metadata = parse_json_area(area)
    header = _from_metadata(metadata, hdr_size, disk.size, ceiling)
    header.seqid = seqid
    header.label = _text(label, "label")
    header.subsystem = _text(subsystem, "subsystem")
    header.uuid = _text(uuid, "uuid")
    header.copy = "primary" if offset == 0 else "secondary"
    return header


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise LuksError(f"JSON area: duplicate key {key!r}")
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise LuksError(f"JSON area: {name} is not JSON")


def parse_json_area(area: bytes) -> dict[str, Any]:
    """The JSON text up to its NUL terminator: UTF-8, no duplicate keys, bounded depth."""
    end = area.find(b"\0")
    if end < 0:
        raise LuksError("JSON area is not NUL-terminated")
    try:
        document = json.loads(
            area[:end].decode("utf-8"),
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constant,
        )
    except UnicodeDecodeError:
        raise LuksError("JSON area is not UTF-8") from None
    except RecursionError:
        raise LuksError("JSON area nests too deeply") from None
    except ValueError as exc:
        if isinstance(exc, LuksError):
            raise
        raise LuksError(f"JSON area is not valid JSON ({exc.args[0].split(':')[0]})") from None
    if not isinstance(document, dict):
        raise LuksError("JSON area is not an object")
    return document


def _obj(
    value: Any, what: str, keys: set[str], optional: frozenset[str] | set[str] = frozenset()
) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise LuksError(f"{what} is not an object")
    missing = keys - value.keys()
    if missing:
        raise LuksError(f"{what} lacks {', '.join(sorted(missing))}")
    unknown = value.keys() - keys - optional
    if unknown:
        raise LuksError(f"{what}: unsupported field(s) {', '.join(sorted(unknown))}")
    return value


def _int(value: Any, what: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise LuksError(f"{what} must be an integer in {low}..{high}")
    return value


def _uint(value: Any, what: str) -> int:
    """LUKS2 writes 64-bit numbers as decimal strings."""
    if not isinstance(value, str) or not _UINT_TEXT.match(value) or int(value) >= 1 << 63:
        raise LuksError(f"{what} must be a decimal string below 2^63")
    return int(value)


def _str(value: Any, what: str, limit: int = 64) -> str:
    if not isinstance(value, str) or not value or len(value) > limit:
        raise LuksError(f"{what} must be a string of 1..{limit} characters")
    return value


def _b64(value: Any, what: str, low: int, high: int) -> bytes:
    if not isinstance(value, str) or len(value) > 4 * high:
        raise LuksError(f"{what} must be base64")
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise LuksError(f"{what} must be base64") from None
    if not low <= len(data) <= high:
        raise LuksError(f"{what} must decode to {low}..{high} bytes")
    return data


def _ids(value: Any, what: str, known: dict[str, Any]) -> list[str]:
    if not isinstance(value, list) or len(value) > LUKS2_MAX_KEYSLOTS:
        raise LuksError(f"{what} must be a list")
    for item in value:
        if not isinstance(item, str) or item not in known:
            raise LuksError(f"{what} names {item!r}, which does not exist")
    return value


def _section(document: dict[str, Any], name: str, limit: int) -> dict[str, Any]:
    section = document[name]
    if not isinstance(section, dict):
        raise LuksError(f"{name} is not an object")
    for key in section:
        if not _ID.match(key) or int(key) >= limit:
            raise LuksError(f"{name}: id {key!r} is not a number below {limit}")
    return section


def _kdf(value: Any, what: str, ceiling: KdfCeiling) -> Kdf:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "pbkdf2":
        obj = _obj(value, what, {"type", "hash", "iterations", "salt"})
        kdf = Kdf(
            "pbkdf2",
            _b64(obj["salt"], f"{what} salt", 1, 1024),
            hash=_str(obj["hash"], f"{what} hash"),
            iterations=_int(obj["iterations"], f"{what} iterations", 1, (1 << 32) - 1),
        )
    elif kind in ("argon2i", "argon2id"):
        obj = _obj(value, what, {"type", "time", "memory", "cpus", "salt"})
        kdf = Kdf(
            kind,
            _b64(obj["salt"], f"{what} salt", 1, 1024),
            time=_int(obj["time"], f"{what} time", 1, (1 << 32) - 1),
            memory_kib=_int(obj["memory"], f"{what} memory", 1, (1 << 32) - 1),
            parallel=_int(obj["cpus"], f"{what} cpus", 1, (1 << 24) - 1),
        )
    else:
        raise LuksError(f"{what}: unsupported KDF type {kind!r} (pbkdf2, argon2i, argon2id)")
    kdf.check(ceiling)
    return kdf


def _from_metadata(
    document: dict[str, Any], hdr_size: int, device_size: int, ceiling: KdfCeiling
) -> Header:
    _obj(document, "JSON area", {"keyslots", "tokens", "segments", "digests", "config"})
    config = _obj(
        document["config"], "config", {"json_size", "keyslots_size"}, {"flags", "requirements"}
    )
    if _uint(config["json_size"], "config.json_size") != hdr_size - LUKS2_BINARY_SIZE:
        raise LuksError("config.json_size does not match the header size")
    keyslots_size = _uint(config["keyslots_size"], "config.keyslots_size")
    if "flags" in config:
        flags = config["flags"]
        if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
            raise LuksError("config.flags must be a list of strings")
    else:
        flags = []
    if "requirements" in config:
        requirements = _obj(config["requirements"], "config.requirements", set(), {"mandatory"})
        mandatory = requirements.get("mandatory", [])
        if not isinstance(mandatory, list) or not all(isinstance(m, str) for m in mandatory):
            raise LuksError("config.requirements.mandatory must be a list of strings")
        if mandatory:
            raise LuksError(
                f"unsupported requirement flag(s) {', '.join(map(repr, mandatory))}"
                " (reencryption in progress or a newer format): refused"
            )
    area_start = 2 * hdr_size
    area_end = area_start + keyslots_size
    if area_end > device_size:
        raise LuksError("keyslots area runs past the end of the device")

    segments = _section(document, "segments", 1 << 10)
    if list(segments) != ["0"]:
        raise LuksError("exactly one data segment (id 0) is supported")
    segment = segments["0"]
    if isinstance(segment, dict) and segment.get("type") != "crypt":
        raise LuksError(f"segment 0: type {segment.get('type')!r} unsupported (crypt only)")
    if isinstance(segment, dict) and "integrity" in segment:
        raise LuksError("segment 0: integrity (AEAD) protection is unsupported")
    _obj(
        segment,
        "segment 0",
        {"type", "offset", "size", "iv_tweak", "encryption", "sector_size"},
        {"flags"},
    )
    if segment.get("flags"):
        raise LuksError("segment 0: flags (reencryption) are unsupported")
    data_offset = _uint(segment["offset"], "segment 0 offset")
    size = segment["size"]
    data_size = None if size == "dynamic" else _uint(size, "segment 0 size")
    sector_size = _int(segment["sector_size"], "segment 0 sector_size", 512, 4096)
    if sector_size not in SECTOR_SIZES:
        raise LuksError("segment 0 sector_size must be 512, 1024, 2048 or 4096")
    iv_tweak = _uint(segment["iv_tweak"], "segment 0 iv_tweak")
    cipher = _str(segment["encryption"], "segment 0 encryption")
    if data_offset % SECTOR or data_offset < area_end:
        raise LuksError("segment 0 offset overlaps the header or is not sector-aligned")
    end = data_offset + (data_size or 0)
    if end > device_size or (data_size is not None and data_size % sector_size):
        raise LuksError("segment 0 does not fit the device in whole sectors")

    digests = _section(document, "digests", LUKS2_MAX_KEYSLOTS)
    keyslot_objs = _section(document, "keyslots", LUKS2_MAX_KEYSLOTS)
    digest_id = None
    segment_digest = None
    bound: dict[str, str] = {}
    for did, value in digests.items():
        obj = _obj(
            value,
            f"digest {did}",
            {"type", "keyslots", "segments", "hash", "iterations", "salt", "digest"},
        )
        if obj["type"] != "pbkdf2":
            raise LuksError(f"digest {did}: unsupported type {obj['type']!r}")
        for sid in _ids(obj["keyslots"], f"digest {did} keyslots", keyslot_objs):
            if sid in bound:
                raise LuksError(f"keyslot {sid} is assigned to two digests")
            bound[sid] = did
        if _ids(obj["segments"], f"digest {did} segments", segments):
            if digest_id is not None:
                raise LuksError("segment 0 has two digests")
            hash_name = _str(obj["hash"], f"digest {did} hash")
            iterations = _int(obj["iterations"], f"digest {did} iterations", 1, (1 << 32) - 1)
            salt = _b64(obj["salt"], f"digest {did} salt", 1, 1024)
            Kdf("pbkdf2", salt, hash=hash_name, iterations=iterations).check(ceiling)
            segment_digest = Digest(
                hash_name, iterations, salt, _b64(obj["digest"], f"digest {did} digest", 16, 64)
            )
            digest_id = did
    if segment_digest is None or digest_id is None:
        raise LuksError("no digest covers segment 0")

    keyslots: dict[int, Keyslot] = {}
    key_size = 0
    for sid, value in keyslot_objs.items():
        what = f"keyslot {sid}"
        if isinstance(value, dict) and value.get("type") == "reencrypt":
            raise LuksError(f"{what}: reencryption in progress is unsupported")
        obj = _obj(value, what, {"type", "key_size", "area", "kdf", "af"}, {"priority"})
        if obj["type"] != "luks2":
            raise LuksError(f"{what}: unsupported type {obj['type']!r}")
        slot_key = _int(obj["key_size"], f"{what} key_size", 1, MAX_KEY_BYTES)
        area = _obj(
            obj["area"], f"{what} area", {"type", "offset", "size", "encryption", "key_size"}
        )
        if area["type"] != "raw":
            raise LuksError(f"{what}: area type {area['type']!r} unsupported (raw only)")
        af = _obj(obj["af"], f"{what} af", {"type", "stripes", "hash"})
        if af["type"] != "luks1":
            raise LuksError(f"{what}: AF type {af['type']!r} unsupported (luks1 only)")
        stripes = _int(af["stripes"], f"{what} af stripes", AF_STRIPES, AF_STRIPES)
        af_hash = _str(af["hash"], f"{what} af hash")
        if af_hash not in HASHES:
            raise LuksError(f"{what}: unsupported AF hash {af_hash!r}")
        offset = _uint(area["offset"], f"{what} area offset")
        length = _uint(area["size"], f"{what} area size")
        area_cipher = _str(area["encryption"], f"{what} area encryption")
        area_key = _int(area["key_size"], f"{what} area key_size", 1, MAX_KEY_BYTES)
        check_cipher(area_cipher, area_key, what)
        if offset % SECTOR or offset < area_start or offset + length > area_end:
            raise LuksError(f"{what}: area outside the keyslots area")
        if length < slot_key * stripes:
            raise LuksError(f"{what}: area smaller than key_size x stripes")
        priority = _int(obj.get("priority", 1), f"{what} priority", 0, 2)
        slot = Keyslot(
            slot_key,
            _kdf(obj["kdf"], f"{what} kdf", ceiling),
            offset,
            length,
            area_cipher,
            area_key,
            stripes,
            af_hash,
            priority,
        )
        for other_id, other in keyslots.items():
            if offset < other.offset + other.size and other.offset < offset + length:
                raise LuksError(f"{what}: area overlaps keyslot {other_id}'s")
        if bound.get(sid) == digest_id:
            keyslots[int(sid)] = slot
            key_size = key_size or slot_key
            if slot_key != key_size:
                raise LuksError(f"{what}: key size differs from the other keyslots'")
    if key_size:
        check_cipher(cipher, key_size, "segment 0")
    else:  # no keyslot left (killed with force): the key size is unknown, the cipher is not
        try:
            parse_cipher_spec(cipher)
        except CipherSpecError as exc:
            raise LuksError(f"segment 0 cipher {cipher!r}: {exc.detail}") from None

    tokens = _section(document, "tokens", LUKS2_MAX_KEYSLOTS)
    for tid, value in tokens.items():
        if not isinstance(value, dict) or not isinstance(value.get("type"), str):
            raise LuksError(f"token {tid} has no type")
        _ids(value.get("keyslots"), f"token {tid} keyslots", keyslot_objs)
    return Header(
        version=2,
        uuid="",
        cipher=cipher,
        key_size=key_size,
        data_offset=data_offset,
        digest=segment_digest,
        keyslots=keyslots,
        sector_size=sector_size,
        data_size=data_size,
        iv_tweak=iv_tweak,
        hdr_size=hdr_size,
        keyslots_size=keyslots_size,
        metadata=document,
        digest_id=digest_id,
        flags=tuple(flags),
    )
