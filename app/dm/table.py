"""The dmsetup table grammar: parse, validate and format, with no I/O.

A table is what ``dmsetup create --table`` reads and ``dmsetup table`` prints::

    <start> <length> <target> <args...>

one line per target, covering sectors ``0..N`` with no gap or overlap.  The rules
are the kernel's (``dm-table.c``, ``dm-crypt.c`` ``crypt_ctr``/``crypt_status``,
``dm-linear.c``, the zero and error targets), checked in the kernel's order so a
table is refused here exactly when ``dmsetup create`` would refuse it, with the
few stricter exceptions documented on the functions below.

Line numbers in errors are physical, 1-based lines of the submitted text, blank
and ``#`` comment lines included, because that is what the user sees in an
editor and what dmsetup reports for a table file.

Key material never reaches a message: every token echoed in an error goes
through ``redact``, and the key token itself is never echoed at all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeAlias

from app.crypto.keys import KeyMaterial
from app.crypto.spec import CipherSpec, parse_cipher_spec
from app.errors import (
    CipherSpecError,
    DeviceNotFound,
    InvalidInput,
    TableError,
    VolumeNotFound,
)
from app.vocab import SECTOR_SIZE, SECTOR_SIZE_512_ONLY_IV_MODES, is_valid_name

__all__ = [
    "TARGET_TYPES",
    "CryptParams",
    "DeviceRef",
    "DeviceSizes",
    "ErrorParams",
    "LinearParams",
    "Table",
    "TableLine",
    "TargetParams",
    "ZeroParams",
    "format_table",
    "normalize",
    "parse_table",
    "redact",
]


TARGET_TYPES = ("crypt", "linear", "zero", "error")

_U64_MAX = 2**64 - 1
_MAX_FEATURE_ARGS = 8  # crypt_ctr_optional: {0, 8, "Invalid number of feature args"}
_DECIMAL_RE = re.compile(r"[0-9]{1,20}")
_HEX_RE = re.compile(r"[0-9A-Fa-f]+")
_HEX_RUN_RE = re.compile(r"[0-9A-Fa-f]{16,}")
_WORD_SEP_RE = re.compile(r"[ \t\r\f\v]+")
_MAJOR_MINOR_RE = re.compile(r"[0-9]+:[0-9]+")
_SHOWN_MAX = 40

# Boolean crypt features, in crypt_status order; matched case-insensitively
# (the kernel uses strcasecmp) and printed in lower case.
_CRYPT_FLAGS = (
    "allow_discards",
    "same_cpu_crypt",
    "submit_from_crypt_cpus",
    "no_read_workqueue",
    "no_write_workqueue",
)
# Kernel features this service does not model, refused by name.
_UNSUPPORTED_FEATURES = ("high_priority", "inline_crypt")


# --------------------------------------------------------------------------- model


@dataclass(frozen=True, slots=True)
class DeviceRef:
    """A backing device or stacked volume named in a table line.

    ``text`` keeps the user's spelling (``sda2`` or ``/dev/sda2``) so a table
    prints back the way it was written; equality and hashing use only
    ``kind`` and ``name``, so both spellings are the same device.
    """

    kind: Literal["device", "volume"]
    name: str
    text: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.kind not in ("device", "volume"):
            raise InvalidInput(f"unknown device reference kind {_shown(self.kind)}")
        reason = _name_problem(self.name)
        if reason is not None:
            raise InvalidInput(reason)
        if not self.text:
            default = self.name if self.kind == "device" else f"/dev/mapper/{self.name}"
            object.__setattr__(self, "text", default)
        elif _split_device_text(self.text) != (self.kind, self.name):
            raise InvalidInput(f"{_shown(self.text)} does not name {self.kind} {self.name}")

    @classmethod
    def parse(cls, text: str) -> DeviceRef:
        """Read ``name``, ``/dev/name`` or ``/dev/mapper/name``; raise InvalidInput."""
        kind, name = _split_device_text(text)
        return cls(kind, name, text)

    @property
    def key(self) -> str:
        """One string per referenced object: ``name`` or ``/dev/mapper/name``."""
        return self.name if self.kind == "device" else f"/dev/mapper/{self.name}"

    def format(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class CryptParams:
    """``crypt`` target arguments, as ``crypt_ctr`` accepts them.

    ``key`` is None for ``-`` (ciphers that take an empty key) and after ``key
    wipe``; ``wiped_key_size`` then keeps the wiped key's length, because the kernel
    keeps ``key_size`` and prints that many zero bytes.  The boolean features and
    ``sector_size`` are the optional parameters; ``integrity`` is refused at parse
    time, so it has no field.
    """

    cipher: CipherSpec
    key: KeyMaterial | None
    iv_offset: int
    device: DeviceRef
    offset: int
    allow_discards: bool = False
    same_cpu_crypt: bool = False
    submit_from_crypt_cpus: bool = False
    no_read_workqueue: bool = False
    no_write_workqueue: bool = False
    sector_size: int = SECTOR_SIZE
    iv_large_sectors: bool = False
    wiped_key_size: int = 0

    def feature_args(self) -> tuple[str, ...]:
        """The optional parameters in ``crypt_status`` order, duplicates folded."""
        words = [flag for flag in _CRYPT_FLAGS if getattr(self, flag)]
        if self.sector_size != SECTOR_SIZE:
            words.append(f"sector_size:{self.sector_size}")
        if self.iv_large_sectors:
            words.append("iv_large_sectors")
        return tuple(words)

    def format(self, *, show_keys: bool = False) -> str:
        """The argument string ``crypt_status`` emits for STATUSTYPE_TABLE."""
        if self.key is None and self.wiped_key_size:
            key_text = "00" * self.wiped_key_size
        elif self.key is None or not len(self.key):
            key_text = "-"
        elif show_keys:
            key_text = self.key.hex().lower()
        else:
            key_text = "0" * (2 * len(self.key))
        text = (
            f"{self.cipher.format()} {key_text} {self.iv_offset} "
            f"{self.device.format()} {self.offset}"
        )
        features = self.feature_args()
        if features:
            text += f" {len(features)} {' '.join(features)}"
        return text


@dataclass(frozen=True, slots=True)
class LinearParams:
    device: DeviceRef
    offset: int

    def format(self, *, show_keys: bool = False) -> str:
        return f"{self.device.format()} {self.offset}"


@dataclass(frozen=True, slots=True)
class ZeroParams:
    def format(self, *, show_keys: bool = False) -> str:
        return ""


@dataclass(frozen=True, slots=True)
class ErrorParams:
    def format(self, *, show_keys: bool = False) -> str:
        return ""


TargetParams: TypeAlias = CryptParams | LinearParams | ZeroParams | ErrorParams


@dataclass(frozen=True, slots=True)
class TableLine:
    """One target: sectors ``start .. start+length`` mapped by ``target``."""

    start: int
    length: int
    target_type: str
    target: TargetParams

    @property
    def end(self) -> int:
        """First sector after this target."""
        return self.start + self.length

    @property
    def device(self) -> DeviceRef | None:
        if isinstance(self.target, CryptParams | LinearParams):
            return self.target.device
        return None

    def format(self, *, show_keys: bool = False) -> str:
        """dmsetup prints ``"%llu %llu %s %s"``: zero/error keep a trailing space."""
        args = self.target.format(show_keys=show_keys)
        return f"{self.start} {self.length} {self.target_type} {args}"


@dataclass(frozen=True, slots=True)
class Table:
    lines: tuple[TableLine, ...]

    @property
    def size_sectors(self) -> int:
        return self.lines[-1].end if self.lines else 0

    def targets_of_type(self, target_type: str) -> tuple[TableLine, ...]:
        return tuple(line for line in self.lines if line.target_type == target_type)

    def crypt_params(self) -> tuple[CryptParams, ...]:
        """The crypt targets' parameters, typed (``targets_of_type`` keeps the union)."""
        return tuple(line.target for line in self.lines if isinstance(line.target, CryptParams))

    @property
    def logical_block_size(self) -> int:
        """Bytes: the largest crypt ``sector_size`` (crypt_io_hints), else 512."""
        return max((params.sector_size for params in self.crypt_params()), default=SECTOR_SIZE)

    def device_refs(self) -> frozenset[DeviceRef]:
        return frozenset(ref for line in self.lines if (ref := line.device) is not None)

    def devices(self) -> set[str]:
        """Every object the table maps onto, as ``DeviceRef.key``.

        Registered devices appear as ``name``, stacked volumes as
        ``/dev/mapper/name``; names cannot contain ``/`` so the two never clash.
        """
        return {ref.key for ref in self.device_refs()}

    def volume_names(self) -> set[str]:
        """Names of stacked volumes, for the lifecycle's cycle check."""
        return {ref.name for ref in self.device_refs() if ref.kind == "volume"}


class DeviceSizes(Protocol):
    """Sizes of backing objects, so parse can check ranges like ``dm_get_device``."""

    def device_size_sectors(self, ref: DeviceRef) -> int:
        """Size in sectors; raise DeviceNotFound or VolumeNotFound."""
        ...


# --------------------------------------------------------------------------- parse


@dataclass(frozen=True, slots=True)
class TableLimits:
    """How big a table the service accepts: each line is checked before it is split."""

    max_lines: int
    max_line_length: int


def parse_table(
    text: str, *, resolve: DeviceSizes | None = None, limits: TableLimits | None = None
) -> Table:
    """Parse and validate table text; raise TableError naming line and field.

    Blank lines, ``#`` comment lines and surrounding whitespace are ignored, as
    dmsetup does.  Stricter than the kernel, on purpose: numbers must be plain
    decimal (no sign), an odd-length hex key is refused rather than truncated,
    words after the counted crypt features are refused rather than ignored, and
    a crypt target must start on a ``sector_size`` boundary (the kernel accepts
    it, then kills every bio that touches the misaligned part).
    """
    lines: list[TableLine] = []
    expected_start = 0
    line_no = last_line_no = 0
    for line_no, raw in enumerate(text.split("\n"), start=1):
        stripped = raw.strip(" \t\r\f\v")
        if not stripped or stripped.startswith("#"):
            continue
        if limits is not None:
            _check_limits(line_no, stripped, len(lines), limits)
        line = _parse_line(line_no, _WORD_SEP_RE.split(stripped), resolve)
        if line.start != expected_start:
            if not lines:
                reason = f"Gap in table: the first line must start at 0, not {line.start}"
            elif line.start > expected_start:
                reason = (
                    f"Gap in table: line starts at {line.start} "
                    f"but the previous line ends at {expected_start}"
                )
            else:
                reason = (
                    f"line starts at {line.start}, overlapping the previous line, "
                    f"which ends at {expected_start}"
                )
            raise TableError(line_no, "start", reason)
        target = line.target
        if isinstance(target, CryptParams) and line.start % (units := target.sector_size // 512):
            raise TableError(
                line_no,
                "start",
                f"crypt target starts at sector {line.start}, not a multiple of "
                f"sector_size {target.sector_size} ({units} sectors)",
            )
        lines.append(line)
        expected_start = line.end
        last_line_no = line_no
    if not lines:
        raise TableError(max(line_no, 1), "table", "empty table: give at least one target line")
    _check_logical_block_alignment(lines, last_line_no)
    return Table(tuple(lines))


def _check_limits(line_no: int, line: str, lines_before: int, limits: TableLimits) -> None:
    if len(line) > limits.max_line_length:
        raise TableError(
            line_no,
            "line",
            f"{len(line)} characters; at most {limits.max_line_length} "
            "(REQCRYPT_MAX_TABLE_LINE_LENGTH)",
        )
    if lines_before >= limits.max_lines:
        raise TableError(
            line_no,
            "table",
            f"more than {limits.max_lines} target lines (REQCRYPT_MAX_TABLE_LINES)",
        )


def _parse_line(line_no: int, words: list[str], resolve: DeviceSizes | None) -> TableLine:
    start = _sector(line_no, "start", words[0], "Invalid start sector")
    if len(words) < 2:
        raise TableError(line_no, "length", "missing: a line is <start> <length> <target> <args>")
    length = _sector(line_no, "length", words[1], "Invalid length")
    if length == 0:
        raise TableError(line_no, "length", "zero-length target")
    if start + length > _U64_MAX:
        raise TableError(line_no, "length", "target ends beyond sector 2^64-1")
    if len(words) < 3:
        raise TableError(line_no, "target", "missing: a line is <start> <length> <target> <args>")
    target_type, args = words[2], words[3:]
    target: TargetParams
    if target_type == "crypt":
        target = _parse_crypt(line_no, length, args)
    elif target_type == "linear":
        target = _parse_linear(line_no, args)
    elif target_type in ("zero", "error"):
        if args:
            raise TableError(line_no, f"{target_type}: args", "No arguments required")
        target = ZeroParams() if target_type == "zero" else ErrorParams()
    else:
        raise TableError(
            line_no,
            "target",
            f"unknown target type {_shown(target_type)}; use one of {', '.join(TARGET_TYPES)}",
        )
    line = TableLine(start, length, target_type, target)
    if resolve is not None and isinstance(target, CryptParams | LinearParams):
        _check_device_range(line_no, target_type, target.device, target.offset, length, resolve)
    return line


def _parse_linear(line_no: int, args: list[str]) -> LinearParams:
    if len(args) != 2:
        raise TableError(
            line_no,
            "linear: args",
            f"Invalid argument count: need <device> <offset>, got {len(args)}",
        )
    device = _device(line_no, "linear", args[0])
    offset = _sector(line_no, "linear: offset", args[1], "Invalid device sector")
    return LinearParams(device, offset)


def _parse_crypt(line_no: int, length: int, args: list[str]) -> CryptParams:
    """Follow crypt_ctr's order: arg count, key form, features, cipher, key, numbers."""
    if len(args) < 5:
        raise TableError(
            line_no,
            "crypt: args",
            "Not enough arguments: need <cipher> <key> <iv_offset> <device> <offset>",
        )
    cipher_text, key_text, iv_offset_text, device_text, offset_text = args[:5]
    if key_text.startswith(":"):
        raise TableError(
            line_no, "crypt: key", "kernel keyring keys are not supported; give the key in hex"
        )
    features = _parse_features(line_no, length, args[5:])
    try:
        cipher = parse_cipher_spec(cipher_text)
    except (CipherSpecError, ValueError) as error:
        raise TableError(line_no, "crypt: cipher", redact(str(error))) from None
    key = _parse_key(line_no, cipher, key_text)
    sector_size = features.sector_size
    if sector_size != SECTOR_SIZE and cipher.ivmode in SECTOR_SIZE_512_ONLY_IV_MODES:
        raise TableError(
            line_no, "crypt: sector_size", f"Unsupported sector size for {cipher.ivmode.upper()}"
        )
    iv_offset = _sector(line_no, "crypt: iv_offset", iv_offset_text, "Invalid iv_offset sector")
    units = sector_size // SECTOR_SIZE
    if iv_offset % units:
        raise TableError(
            line_no,
            "crypt: iv_offset",
            f"Invalid iv_offset sector: {iv_offset} is not a multiple of "
            f"sector_size {sector_size} ({units} sectors)",
        )
    device = _device(line_no, "crypt", device_text)
    offset = _sector(line_no, "crypt: offset", offset_text, "Invalid device sector")
    return CryptParams(
        cipher=cipher,
        key=key,
        iv_offset=iv_offset,
        device=device,
        offset=offset,
        allow_discards=features.flags["allow_discards"],
        same_cpu_crypt=features.flags["same_cpu_crypt"],
        submit_from_crypt_cpus=features.flags["submit_from_crypt_cpus"],
        no_read_workqueue=features.flags["no_read_workqueue"],
        no_write_workqueue=features.flags["no_write_workqueue"],
        sector_size=sector_size,
        iv_large_sectors=features.iv_large_sectors,
    )


@dataclass(slots=True)
class _Features:
    flags: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(_CRYPT_FLAGS, False))
    sector_size: int = SECTOR_SIZE
    iv_large_sectors: bool = False


def _parse_features(line_no: int, length: int, words: list[str]) -> _Features:
    """crypt_ctr_optional: ``<#opt> <opt>...``; repeats are idempotent, last sector_size wins."""
    features = _Features()
    if not words:
        return features
    field_name = "crypt: feature args"
    count_text, rest = words[0], words[1:]
    if not _DECIMAL_RE.fullmatch(count_text) or int(count_text) > _MAX_FEATURE_ARGS:
        raise TableError(
            line_no,
            field_name,
            f"Invalid number of feature args: give a count from 0 to {_MAX_FEATURE_ARGS}",
        )
    count = int(count_text)
    if count != len(rest):
        raise TableError(
            line_no,
            field_name,
            f"Invalid number of feature args: the count is {count} but {len(rest)} follow",
        )
    for word in rest:
        lowered = word.lower()
        if lowered in features.flags:
            features.flags[lowered] = True
        elif lowered == "iv_large_sectors":
            features.iv_large_sectors = True
        elif word.startswith("sector_size:"):
            features.sector_size = _sector_size(line_no, length, word.removeprefix("sector_size:"))
        elif word.startswith("integrity:"):
            raise TableError(line_no, field_name, "integrity is not supported")
        elif lowered in _UNSUPPORTED_FEATURES:
            raise TableError(line_no, field_name, f"{lowered} is not supported")
        else:
            raise TableError(
                line_no, field_name, f"Invalid feature arguments: unknown feature {_shown(word)}"
            )
    return features


def _sector_size(line_no: int, length: int, value_text: str) -> int:
    field_name = "crypt: sector_size"
    value = int(value_text) if _DECIMAL_RE.fullmatch(value_text) else 0
    if not SECTOR_SIZE <= value <= 4096 or value & (value - 1):
        raise TableError(
            line_no,
            field_name,
            "Invalid feature value for sector_size: give a power of two from 512 to 4096",
        )
    units = value // SECTOR_SIZE
    if length % units:
        raise TableError(
            line_no,
            field_name,
            f"Device size is not multiple of sector_size feature: length {length} "
            f"is not a multiple of {units} sectors",
        )
    return value


def _parse_key(line_no: int, cipher: CipherSpec, key_text: str) -> KeyMaterial | None:
    """Hex key sized for the cipher, or ``-`` for an empty key; never echoes the key."""
    sizes = tuple(sorted(set(cipher.valid_key_sizes)))
    name = cipher.format()
    if key_text == "-":
        if 0 in sizes:
            return None
        raise TableError(line_no, "crypt: key", f"key is '-' (none); {name} needs {_sizes(sizes)}")
    if not _HEX_RE.fullmatch(key_text):
        raise TableError(line_no, "crypt: key", "key is not hexadecimal")
    if len(key_text) % 2 or len(key_text) // 2 not in sizes:
        raise TableError(
            line_no,
            "crypt: key",
            f"key is {len(key_text)} hex digits; {name} needs {_sizes(sizes)}",
        )
    try:
        return KeyMaterial.from_hex(key_text)
    except (CipherSpecError, ValueError):
        raise TableError(line_no, "crypt: key", "key is not hexadecimal") from None


def _sizes(sizes: tuple[int, ...]) -> str:
    """``64, 96 or 128`` (hex digits), with ``'-'`` for an empty key."""
    words = ["'-' (no key)" if size == 0 else str(2 * size) for size in sizes]
    if not words:
        return "a key this service cannot accept"
    if len(words) > 4 and 0 not in sizes:
        listed = f"{words[0]} to {words[-1]}"
    elif len(words) == 1:
        listed = words[0]
    else:
        listed = f"{', '.join(words[:-1])} or {words[-1]}"
    return listed if sizes == (0,) else f"{listed} hex digits"


def _sector(line_no: int, field_name: str, text: str, reason: str) -> int:
    """Unsigned decimal that fits sector_t (u64), as ``sscanf("%llu")`` minus signs."""
    if not _DECIMAL_RE.fullmatch(text) or int(text) > _U64_MAX:
        raise TableError(
            line_no,
            field_name,
            f"{reason}: give an unsigned decimal below 2^64, not {_shown(text)}",
        )
    return int(text)


def _device(line_no: int, target_type: str, text: str) -> DeviceRef:
    try:
        return DeviceRef.parse(text)
    except InvalidInput as error:
        raise TableError(line_no, f"{target_type}: device", error.detail) from None


def _check_device_range(
    line_no: int,
    target_type: str,
    device: DeviceRef,
    offset: int,
    length: int,
    resolve: DeviceSizes,
) -> None:
    """dm_get_device + device_area_is_invalid: the mapped range must exist."""
    field_name = f"{target_type}: device"
    try:
        size = resolve.device_size_sectors(device)
    except (DeviceNotFound, VolumeNotFound):
        raise TableError(
            line_no, field_name, f"Device lookup failed: no {device.kind} {_shown(device.name)}"
        ) from None
    if offset + length > size:
        raise TableError(
            line_no,
            field_name,
            f"{device.kind} {_shown(device.name)} is {size} sectors; "
            f"target needs offset {offset} + length {length}",
        )


def _check_logical_block_alignment(lines: list[TableLine], last_line_no: int) -> None:
    """validate_hardware_logical_block_alignment, with 512-byte backing devices.

    A crypt target advertises ``sector_size`` as the volume's logical block
    size, so the whole table must be a multiple of the largest one.
    """
    block = Table(tuple(lines)).logical_block_size
    units = block // SECTOR_SIZE
    total = lines[-1].end
    if total % units:
        raise TableError(
            last_line_no,
            "length",
            f"table size {total} sectors is not aligned to the logical block size {block} "
            f"({units} sectors)",
        )


# --------------------------------------------------------------------------- format


def format_table(table: Table, *, show_keys: bool = False) -> str:
    """Exactly ``dmsetup table`` output: one ``\\n``-terminated line per target.

    Keys print as zeros of the same length unless ``show_keys`` (dmsetup's
    ``--showkeys``), then as lower-case hex like the kernel's ``hex2asc``.
    """
    return "".join(f"{line.format(show_keys=show_keys)}\n" for line in table.lines)


def normalize(text: str) -> str:
    """The canonical form of table text, keys shown: ``format(parse(text))``."""
    return format_table(parse_table(text), show_keys=True)


# --------------------------------------------------------------------------- redact


def redact(text: str) -> str:
    """Zero anything key-like in raw table text so it can go into logs and errors.

    The fifth word of a crypt line (the key, unless ``-`` or a ``:keyring``
    reference, which dmsetup also leaves visible) and every run of 16 or more
    hex digits anywhere become ``0`` characters of the same length.
    """
    return "\n".join(_redact_line(line) for line in text.split("\n"))


def _redact_line(line: str) -> str:
    parts = re.split(r"([ \t\r\f\v]+)", line)
    word_indexes = [index for index, part in enumerate(parts) if part and index % 2 == 0]
    if len(word_indexes) >= 5 and parts[word_indexes[2]].lower() == "crypt":
        key_index = word_indexes[4]
        key = parts[key_index]
        if key != "-" and not key.startswith(":"):
            parts[key_index] = "0" * len(key)
    return _HEX_RUN_RE.sub(lambda match: "0" * len(match.group()), "".join(parts))


def _shown(token: str) -> str:
    """A user token safe to quote in a message: redacted and bounded."""
    safe = redact(token)
    if len(safe) > _SHOWN_MAX:
        safe = safe[: _SHOWN_MAX - 3] + "..."
    return f'"{safe}"'


def _split_device_text(text: str) -> tuple[Literal["device", "volume"], str]:
    if _MAJOR_MINOR_RE.fullmatch(text):
        raise InvalidInput("device numbers (major:minor) are not supported; give the device name")
    if text.startswith("/dev/mapper/"):
        name, kind = text.removeprefix("/dev/mapper/"), "volume"
    else:
        name, kind = text.removeprefix("/dev/"), "device"
    reason = _name_problem(name)
    if reason is not None:
        raise InvalidInput(reason)
    return ("volume" if kind == "volume" else "device"), name


def _name_problem(name: str) -> str | None:
    if not is_valid_name(name):
        return (
            f"invalid device name {_shown(name)}: use 1 to 64 of A-Z a-z 0-9 . _ -, not '.' or '..'"
        )
    return None
