"""The words every layer shares, each defined once: sectors, data units, ops, modes, names.

A leaf: imports nothing from ``app``, so any package may use it without
bending the downward dependencies (``api/nbd -> io -> dm -> blk/engine -> crypto``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import StrEnum
from typing import Literal, TypeAlias, get_args

SECTOR_SIZE = 512
"""Bytes per sector: the unit of every address in a table and a bio."""
SECTOR_SHIFT = 9

DATA_UNIT_SIZES = frozenset({512, 1024, 2048, 4096})
"""dm-crypt's ``sector_size`` choices: powers of two from 512 to 4096."""

SECTOR_SIZE_512_ONLY_IV_MODES = frozenset({"lmk", "tcw"})
"""IV modes dm-crypt only runs on 512-byte data units (crypt_ctr_optional)."""


class Op(StrEnum):
    """Block request operations (``REQ_OP_*``)."""

    READ = "read"
    WRITE = "write"
    FLUSH = "flush"
    DISCARD = "discard"
    WRITE_ZEROES = "write_zeroes"


# The members as plain names for per-I/O code: on Python 3.11 ``Op.READ`` goes through
# ``EnumType.__getattr__``'s slow attribute hook, ten times the cost of a global.
REQ_OP_READ, REQ_OP_WRITE, REQ_OP_FLUSH = Op.READ, Op.WRITE, Op.FLUSH
REQ_OP_DISCARD, REQ_OP_WRITE_ZEROES = Op.DISCARD, Op.WRITE_ZEROES


def align_down(value: int, unit: int) -> int:
    """``value`` rounded down to a multiple of ``unit`` (the kernel's ``round_down``)."""
    return value - value % unit


def div_round_up(value: int, unit: int) -> int:
    """How many ``unit``-sized pieces hold ``value`` (the kernel's ``DIV_ROUND_UP``)."""
    return -(-value // unit)


def align_up(value: int, unit: int) -> int:
    """``value`` rounded up to a multiple of ``unit`` (the kernel's ``round_up``)."""
    return div_round_up(value, unit) * unit


Wait: TypeAlias = Callable[[], None]
"""Returns once a submitted I/O is done, raising its error (``wait_for_completion``)."""


def completed() -> None:
    """The wait of an I/O that was done before its submission returned: one object, so
    that whoever gets it may take the I/O as done without calling it."""


VolumeState: TypeAlias = Literal["active", "suspended"]
"""A volume admits I/O (``active``) or holds it at the gate (``suspended``), as dm's
``DM_SUSPEND_FLAG`` says."""

StoreKind: TypeAlias = Literal["file", "rbd"]
"""Where a backing device's bytes live: a sparse file, or an RBD image in a Ceph pool."""

CipherOp: TypeAlias = Literal["encrypt", "decrypt"]
"""What a cipher call does to a data unit; not a block op."""

DispatchMode: TypeAlias = Literal["bio", "request"]
"""Per volume: each bio alone (``bio``) or bios merged into requests (``request``)."""
DISPATCH_MODES: tuple[DispatchMode, ...] = get_args(DispatchMode)

ElevatorName: TypeAlias = Literal["none", "mq-deadline"]
"""I/O scheduler names, as in ``/sys/block/*/queue/scheduler``."""
ELEVATOR_NAMES: tuple[ElevatorName, ...] = get_args(ElevatorName)

DEFAULT_QUEUE_DEPTH = 32
"""Hardware tags of a device whose model does not say (SATA NCQ's depth)."""
MAX_QUEUE_DEPTH = 1023
"""NVMe's deepest queue: the largest ``queue_depth`` a model may ask for."""

MAX_DEVICE_BYTES = 1 << 50
"""The largest backing device any configuration allows (REQCRYPT_MAX_DEVICE_BYTES' ceiling)."""

TABLE_PATTERN = r"\S"
"""A table holds at least one non-blank character (an empty table has no target line)."""

NAME_PATTERN = (
    r"^([A-Za-z0-9_-][A-Za-z0-9._-]{0,63}"
    r"|\.[A-Za-z0-9_-][A-Za-z0-9._-]{0,62}"
    r"|\.\.[A-Za-z0-9._-]{1,62})$"
)
"""Device and volume names: 1-64 of letters, digits, ``._-``, but not ``.`` or ``..`` (no
path separators, no directory names). Spelt without a lookahead, which JSON Schema
validators and pydantic's regex engine need not support."""
_NAME_RE = re.compile(NAME_PATTERN)

MODEL_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
"""Engine and device model names: lower case, as preset names are."""
_MODEL_NAME_RE = re.compile(MODEL_NAME_PATTERN)


def is_valid_name(name: str) -> bool:
    """A device or volume name: also a file name under the data directory."""
    return bool(_NAME_RE.fullmatch(name)) and name not in (".", "..")


def is_valid_model_name(name: str) -> bool:
    return bool(_MODEL_NAME_RE.fullmatch(name))
