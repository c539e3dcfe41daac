"""A volume's queue tuning as one frozen value: what create sets and PATCH changes.

The API builds it, the control plane persists it and the volume applies it, so
a new knob is added here once instead of threaded through every layer's signature.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TypeAlias

from app.blk.limits import QueueLimits
from app.errors import InvalidInput
from app.vocab import DISPATCH_MODES, ELEVATOR_NAMES, DispatchMode, ElevatorName

CryptSplit: TypeAlias = tuple[int | None, int | None]
"""dm-crypt's ``max_read_size`` and ``max_write_size`` in bytes; None: no split."""


@dataclass(frozen=True, slots=True)
class Tuning:
    """``plug_window_us`` None means the service default, resolved when the queue is built;
    so do ``max_read_size`` / ``max_write_size`` (dm-crypt's split, ``crypt_split``)."""

    dispatch_mode: DispatchMode = "request"
    elevator: ElevatorName = "none"
    limits: QueueLimits = field(default_factory=QueueLimits)
    plug_window_us: int | None = None
    max_read_size: int | None = None
    max_write_size: int | None = None

    def validate(self) -> Tuning:
        """Refuse what the queue would refuse, before anything is written."""
        if self.dispatch_mode not in DISPATCH_MODES:
            raise InvalidInput(f"dispatch_mode must be one of {', '.join(DISPATCH_MODES)}")
        if self.elevator not in ELEVATOR_NAMES:
            raise InvalidInput(f"elevator must be one of {', '.join(ELEVATOR_NAMES)}")
        if self.plug_window_us is not None and self.plug_window_us < 0:
            raise InvalidInput("plug_window_us must not be negative")
        for name in ("max_read_size", "max_write_size"):
            size = getattr(self, name)
            if size is not None and (size < 4096 or size % 4096 or size > 1 << 30):
                raise InvalidInput(f"{name} must be a multiple of 4096 from 4096 to 1 GiB")
        self.limits.validate()
        return self

    def plug_window(self, default_us: int) -> int:
        return default_us if self.plug_window_us is None else self.plug_window_us

    def crypt_split(self, default: CryptSplit) -> CryptSplit:
        """dm-crypt's split sizes this volume runs with: its own, else the service's."""
        read, write = default
        return (
            read if self.max_read_size is None else self.max_read_size,
            write if self.max_write_size is None else self.max_write_size,
        )

    def limits_for(self, block_size: int) -> QueueLimits:
        """The limits a queue runs with under a table of ``block_size`` logical blocks: a
        table's block size raises the logical block size, never lowers it."""
        if self.limits.logical_block_size < block_size:
            return replace(self.limits, logical_block_size=block_size)
        return self.limits


@dataclass(frozen=True, slots=True)
class TuningPatch:
    """PATCH semantics: a field left None keeps the volume's current value."""

    dispatch_mode: DispatchMode | None = None
    elevator: ElevatorName | None = None
    limits: QueueLimits | None = None
    plug_window_us: int | None = None
    max_read_size: int | None = None
    max_write_size: int | None = None

    def apply(self, tuning: Tuning) -> Tuning:
        changes = {
            item.name: value
            for item in fields(self)
            if (value := getattr(self, item.name)) is not None
        }
        return replace(tuning, **changes).validate()
