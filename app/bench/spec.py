"""A benchmark job as submitted: the volume (named or templated), the workload, the sweep.

Pure: parsing and validating a spec and expanding its sweep into cells touch
neither a volume nor SQL, so a bad spec is refused before anything runs.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from app.bench.workload import RW_MODES, Workload
from app.dm.table import redact
from app.errors import InvalidInput
from app.sizes import parse_size
from app.vocab import DISPATCH_MODES, SECTOR_SIZE, DispatchMode

__all__ = [
    "MAX_CELLS",
    "MAX_DEVICE_BYTES",
    "ROUNDS",
    "SWEEP_AXES",
    "WARMUP",
    "CellPlan",
    "Count",
    "JobSpec",
    "VolumeTemplate",
]

SWEEP_AXES = ("engine", "table", "dispatch_mode", "rw", "bs", "iodepth", "numjobs")
MAX_CELLS = 256
MAX_DEVICE_BYTES = 16 << 30


@dataclass(frozen=True, slots=True)
class Count:
    """A job's count field: its default and the bounds the spec, the API and the CLI enforce."""

    default: int
    minimum: int
    maximum: int

    def of(self, data: Mapping[str, Any], key: str) -> int:
        value = data.get(key, self.default)
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not self.minimum <= value <= self.maximum
        ):
            raise InvalidInput(
                f"{key} must be a whole number from {self.minimum} to {self.maximum}"
            )
        return value


#: Six rounds are the fewest whose min..max interval covers the median at 95 % (96.9 %).
ROUNDS = Count(default=6, minimum=1, maximum=50)
WARMUP = Count(default=1, minimum=0, maximum=10)


@dataclass(frozen=True, slots=True)
class VolumeTemplate:
    """A table with ``{dev}`` for a fresh device of ``device_size`` bytes and ``device_model``."""

    table: str
    device_size: int
    device_model: str = "none"


@dataclass(frozen=True, slots=True)
class JobSpec:
    """Exactly one of ``volume`` (retuned per cell, then restored) and ``volume_template``."""

    volume: str | None
    volume_template: VolumeTemplate | None
    engine: str | None
    workload: Workload
    sweep: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    label: str = ""
    rounds: int = ROUNDS.default
    warmup: int = WARMUP.default

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        known = {
            "volume",
            "volume_template",
            "engine",
            "workload",
            "sweep",
            "label",
            "rounds",
            "warmup",
        }
        unknown = set(data) - known
        if unknown:
            raise InvalidInput(f"benchmark: unknown field(s) {', '.join(sorted(unknown))}")
        volume = data.get("volume")
        raw_template = data.get("volume_template")
        if (volume is None) == (raw_template is None):
            raise InvalidInput("give exactly one of volume or volume_template")
        template = None
        if raw_template is not None:
            if not isinstance(raw_template, Mapping) or not isinstance(
                raw_template.get("table"), str
            ):
                raise InvalidInput("volume_template needs a table with {dev} for the device")
            template = VolumeTemplate(
                table=raw_template["table"],
                device_size=parse_size(raw_template.get("device_size", 64 << 20)),
                device_model=str(raw_template.get("device_model") or "none"),
            )
            if "{dev}" not in template.table:
                raise InvalidInput("volume_template.table must name the device as {dev}")
            if (
                not 0 < template.device_size <= MAX_DEVICE_BYTES
                or template.device_size % SECTOR_SIZE
            ):
                raise InvalidInput("device_size must be a multiple of 512, at most 16 GiB")
        sweep = dict(data.get("sweep") or {})
        for axis, values in sweep.items():
            if axis not in SWEEP_AXES:
                raise InvalidInput(f"sweep: unknown axis {axis!r} (axes: {', '.join(SWEEP_AXES)})")
            if not isinstance(values, list | tuple) or not values:
                raise InvalidInput(f"sweep.{axis} must be a non-empty list")
        if "table" in sweep and template is None:
            raise InvalidInput("sweep.table needs a volume_template")
        for mode in sweep.get("dispatch_mode", []):
            if mode not in DISPATCH_MODES:
                raise InvalidInput("sweep.dispatch_mode values are bio and request")
        for rw in sweep.get("rw", []):
            if rw not in RW_MODES:
                raise InvalidInput(f"sweep.rw values are {', '.join(RW_MODES)}")
        sweep = {
            axis: [parse_size(v) for v in values] if axis == "bs" else list(values)
            for axis, values in sweep.items()
        }
        spec = cls(
            volume=None if volume is None else str(volume),
            volume_template=template,
            engine=data.get("engine"),
            workload=Workload.from_dict(data.get("workload") or {}),
            sweep=sweep,
            label=str(data.get("label") or ""),
            rounds=ROUNDS.of(data, "rounds"),
            warmup=WARMUP.of(data, "warmup"),
        )
        points = spec.points()
        if len(points) > MAX_CELLS:
            raise InvalidInput(f"the sweep has {len(points)} cells; at most {MAX_CELLS}")
        for point in points:
            point.workload.validate()
            if template is not None and point.workload.span > template.device_size:
                raise InvalidInput(
                    f"the workload touches {point.workload.span} bytes; device_size is "
                    f"{template.device_size}"
                )
        return spec

    def to_dict(self) -> dict[str, Any]:
        """The spec as persisted and shown: keys in tables are zeroed (re-run with any key)."""
        template = None
        if self.volume_template is not None:
            template = {
                "table": redact(self.volume_template.table),
                "device_size": self.volume_template.device_size,
                "device_model": self.volume_template.device_model,
            }
        sweep = {
            axis: [redact(v) for v in values] if axis == "table" else list(values)
            for axis, values in self.sweep.items()
        }
        return {
            "volume": self.volume,
            "volume_template": template,
            "engine": self.engine,
            "workload": self.workload.to_dict(),
            "sweep": sweep,
            "label": self.label,
            "rounds": self.rounds,
            "warmup": self.warmup,
        }

    @property
    def runs_per_cell(self) -> int:
        """How many times each cell's workload runs: warm-up and kept rounds."""
        return self.rounds + self.warmup

    def points(self) -> list[CellPlan]:
        """The sweep's cartesian product, in ``SWEEP_AXES`` order (engine outermost)."""
        axes = [axis for axis in SWEEP_AXES if axis in self.sweep]
        plans = []
        for index, values in enumerate(itertools.product(*(self.sweep[a] for a in axes))):
            point = dict(zip(axes, values, strict=True))
            workload = replace(
                self.workload,
                **{k: point[k] for k in ("rw", "bs", "iodepth", "numjobs") if k in point},
            )
            table = point.get("table")
            if table is None and self.volume_template is not None:
                table = self.volume_template.table
            plans.append(
                CellPlan(
                    index=index,
                    engine=point.get("engine", self.engine),
                    dispatch_mode=point.get("dispatch_mode"),
                    table=table,
                    workload=workload,
                )
            )
        return plans


@dataclass(frozen=True, slots=True)
class CellPlan:
    """One point of the sweep: ``None`` keeps the volume's (or the service's default) setting."""

    index: int
    engine: str | None
    dispatch_mode: DispatchMode | None
    table: str | None
    workload: Workload
