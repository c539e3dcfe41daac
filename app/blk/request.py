"""Requests: one or more contiguous bios of one op, dispatched as a unit."""

from __future__ import annotations

import itertools
from dataclasses import KW_ONLY, dataclass, field
from enum import IntEnum

from app.blk.bio import Bio, SectorOp, bio_endio
from app.blk.trace import Tracer
from app.vocab import div_round_up

_serials = itertools.count()


def count_phys_segments(segments: list[memoryview], max_segment_size: int) -> int:
    """Physical segments of a buffer list.

    The kernel coalesces adjacent bvecs that are contiguous in memory; separate
    ``memoryview`` objects give no cheap contiguity test, so each buffer counts
    as its own segment, split into ``max_segment_size`` pieces when larger.
    """
    count = 0
    for segment in segments:
        size = segment.nbytes
        count += 1 if size <= max_segment_size else div_round_up(size, max_segment_size)
    return count


class RqState(IntEnum):
    """Where a request is: held in the plug, queued in the elevator, in dispatch, done."""

    PLUGGED = 0
    QUEUED = 1
    DISPATCHED = 2
    DONE = 3


@dataclass(slots=True, eq=False, repr=False)
class Request(SectorOp):
    """A merged I/O; ``segments`` is the concatenation of the bios' segments.

    Besides the kernel fields it carries the queue's ordering bookkeeping:
    ``wait_count`` earlier overlapping requests still pending, ``dependents``
    to release on completion, and ``ordered`` once any such edge exists (an
    ordered request never takes part in a request-request merge, which could
    otherwise close a dependency cycle).
    """

    bios: list[Bio]
    segments: list[memoryview]
    nr_phys_segments: int
    _: KW_ONLY
    start_time: int = 0
    dispatch_time: int = field(default=0, init=False)
    serial: int = field(default_factory=_serials.__next__, init=False)
    state: RqState = field(default=RqState.PLUGGED, init=False)
    wait_count: int = field(default=0, init=False)
    dependents: list[Request] = field(default_factory=list, init=False)
    ordered: bool = field(default=False, init=False)
    fifo_deadline: int = field(default=0, init=False)
    #: The queue's tracer when the request was made: targets trace engine calls on it.
    tracer: Tracer | None = field(default=None, init=False)

    @classmethod
    def from_bio(cls, bio: Bio, max_segment_size: int, start_time: int = 0) -> Request:
        return cls(
            bio.op,
            bio.sector,
            bio.nr_sectors,
            [bio],
            list(bio.segments),
            count_phys_segments(bio.segments, max_segment_size),
            fua=bio.fua,
            preflush=bio.preflush,
            no_merge=bio.no_merge,
            start_time=start_time,
        )

    @property
    def may_overwrite(self) -> bool:
        """Every bio's segments may be overwritten: read from the bios, so that no merge
        can join a buffer its submitter still needs to one that may be overwritten."""
        bios = self.bios
        if len(bios) == 1:  # a lone bio: no generator
            return bios[0].may_overwrite
        return all(bio.may_overwrite for bio in bios)

    def complete(self, status: BaseException | None = None) -> None:
        """End every bio with the same status (blk_mq_end_request)."""
        for bio in self.bios:
            bio_endio(bio, status)

    def __repr__(self) -> str:
        return (
            f"Request({self.op}, sector={self.sector}, nr_sectors={self.nr_sectors}, "
            f"bios={len(self.bios)}, segments={self.nr_phys_segments}, state={self.state.name})"
        )
