"""fio's vocabulary for a workload, and the pure plan of which I/O goes where.

Offsets are a pure function of the workload and the job number (seeded), so a
result can be re-run exactly and tests need no volume. Each of ``numjobs``
jobs owns the region ``offset + job * size`` … ``+ size`` (fio's
``offset_increment = size``): concurrent sequential writers are distinct
streams, as separate fio jobs on one device would be.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

from app.errors import InvalidInput
from app.sizes import parse_size

Rw = Literal["read", "write", "randread", "randwrite", "randrw", "readwrite"]
IoOp = Literal["read", "write"]
RW_MODES: tuple[str, ...] = get_args(Rw)
SECTOR = 512


@dataclass(frozen=True, slots=True)
class Workload:
    """One fio job description (per job; ``numjobs`` copies run side by side).

    ``size`` bounds each job unless ``runtime`` (seconds) is set, which loops
    over the region until the time is up (fio's ``time_based``). ``direct`` is
    recorded; the service has no page cache, so ``direct=False`` only adds a
    flush at the end of each job (fio's ``end_fsync``).
    """

    rw: Rw = "read"
    bs: int = 4096
    size: int = 1 << 20
    offset: int = 0
    iodepth: int = 1
    numjobs: int = 1
    direct: bool = True
    runtime: float | None = None
    rwmixread: int = 50
    seed: int = 0

    @property
    def concurrency(self) -> int:
        return self.iodepth * self.numjobs

    @property
    def span(self) -> int:
        """Bytes of the volume the workload touches, from 0."""
        return self.offset + self.size * self.numjobs

    @property
    def total_bytes(self) -> int:
        """Bytes moved by a size-bound run."""
        return self.size // self.bs * self.bs * self.numjobs

    def validate(self) -> Workload:
        if self.rw not in RW_MODES:
            raise InvalidInput(f"rw must be one of {', '.join(RW_MODES)}")
        if self.bs < SECTOR or self.bs % SECTOR:
            raise InvalidInput("bs must be a positive multiple of 512")
        if self.size < self.bs:
            raise InvalidInput("size must hold at least one block of bs bytes")
        if self.offset < 0 or self.offset % SECTOR:
            raise InvalidInput("offset must be a non-negative multiple of 512")
        if not 1 <= self.iodepth <= 256 or not 1 <= self.numjobs <= 64:
            raise InvalidInput("iodepth must be 1..256 and numjobs 1..64")
        if not 0 <= self.rwmixread <= 100:
            raise InvalidInput("rwmixread must be 0..100")
        if self.runtime is not None and not 0 < self.runtime <= 3600:
            raise InvalidInput("runtime must be 0..3600 seconds")
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Workload:
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise InvalidInput(f"workload: unknown field(s) {', '.join(sorted(unknown))}")
        values = dict(data)
        for key in ("bs", "size", "offset"):
            if key in values:
                values[key] = parse_size(values[key])
        return cls(**values).validate()


@dataclass(frozen=True, slots=True)
class IoUnit:
    """One I/O of a job, fio's ``io_u`` (not the service's ``app.io.Io``)."""

    op: IoOp
    offset: int
    length: int


def _rng(workload: Workload, job: int) -> random.Random:
    # Distinct, reproducible streams per job; string seeding is stable across runs.
    return random.Random(f"reqcrypt-bench/{workload.seed}/{job}")


def job_ios(workload: Workload, job: int) -> Iterator[IoUnit]:
    """One pass of job ``job`` over its region, in fio's order for ``rw``.

    Random modes visit every block exactly once in a seeded permutation (fio's
    random map); ``randrw`` and ``readwrite`` draw read vs write with
    probability ``rwmixread`` from the same seeded generator.
    """
    base = workload.offset + job * workload.size
    blocks = workload.size // workload.bs
    rng = _rng(workload, job)
    order: list[int] | range = range(blocks)
    if workload.rw.startswith("rand"):
        order = list(range(blocks))
        rng.shuffle(order)
    for block in order:
        op: IoOp
        if workload.rw in ("read", "randread"):
            op = "read"
        elif workload.rw in ("write", "randwrite"):
            op = "write"
        else:
            op = "read" if rng.random() * 100 < workload.rwmixread else "write"
        yield IoUnit(op, base + block * workload.bs, workload.bs)
