"""Merge decisions (block/blk-merge.c). Pure: no I/O, no threads, no locks.

A bio joins a request only when the result is still one contiguous run of one
op, within the queue limits, and inside one merge-boundary region. Boundaries
are the dm table's target starts: a request never spans two targets, which
for crypt also keeps data unit numbers contiguous inside a request (the
blk-crypto rule that only requests with contiguous DUNs merge).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from enum import Enum

from app.blk.bio import Bio
from app.blk.limits import QueueLimits
from app.blk.request import Request, count_phys_segments
from app.vocab import Op

#: FLUSH and WRITE_ZEROES requests never merge (rq_mergeable); contiguous
#: discards merge like reads and writes.
MERGEABLE_OPS = frozenset({Op.READ, Op.WRITE, Op.DISCARD})


class MergeType(Enum):
    """Where a bio would join a request (ELEVATOR_*_MERGE)."""

    NONE = "none"
    BACK = "back"
    FRONT = "front"


class MergeStatus(Enum):
    """Outcome of a merge attempt (enum bio_merge_status)."""

    OK = "ok"
    NONE = "none"
    FAILED = "failed"


def bio_mergeable(bio: Bio) -> bool:
    """Barrier bios (preflush, FUA) and flushes stay alone."""
    return bio.op in MERGEABLE_OPS and not (bio.no_merge or bio.fua or bio.preflush)


def rq_mergeable(rq: Request) -> bool:
    return rq.op in MERGEABLE_OPS and not (rq.no_merge or rq.fua or rq.preflush)


def crosses_boundary(start: int, end: int, boundaries: Sequence[int]) -> bool:
    """Whether ``[start, end)`` contains a boundary strictly inside it."""
    if not boundaries:
        return False
    index = bisect_right(boundaries, start)
    return index < len(boundaries) and boundaries[index] < end


def next_boundary(sector: int, boundaries: Sequence[int]) -> int | None:
    """The first boundary after ``sector``, where a bio starting there must be split."""
    index = bisect_right(boundaries, sector)
    return boundaries[index] if index < len(boundaries) else None


def rq_merge_ok(rq: Request, bio: Bio, limits: QueueLimits, boundaries: Sequence[int]) -> bool:
    """Whether ``bio`` may join ``rq`` at all, before looking at position (blk_rq_merge_ok).

    Limits are checked by the attempt functions: exceeding them is a FAILED
    merge, which marks the request full (``no_merge``).
    """
    if limits.nomerges == 2:
        return False
    if not rq_mergeable(rq) or not bio_mergeable(bio):
        return False
    if rq.op is not bio.op:
        return False
    start = min(rq.sector, bio.sector)
    end = max(rq.end_sector, bio.end_sector)
    return not crosses_boundary(start, end, boundaries)


def try_merge(rq: Request, bio: Bio) -> MergeType:
    """Position test only (blk_try_merge)."""
    if rq.sector + rq.nr_sectors == bio.sector:
        return MergeType.BACK
    if rq.sector - bio.nr_sectors == bio.sector:
        return MergeType.FRONT
    return MergeType.NONE


def _fits(rq: Request, nr_sectors: int, nr_phys_segments: int, limits: QueueLimits) -> bool:
    return (
        rq.nr_sectors + nr_sectors <= limits.max_sectors
        and rq.nr_phys_segments + nr_phys_segments <= limits.max_segments
    )


def attempt_back_merge(rq: Request, bio: Bio, limits: QueueLimits) -> MergeStatus:
    """Append ``bio`` (already known to be contiguous and compatible) to ``rq``."""
    segments = count_phys_segments(bio.segments, limits.max_segment_size)
    if not _fits(rq, bio.nr_sectors, segments, limits):
        rq.no_merge = True  # req_set_nomerge: a full request stops attracting bios
        return MergeStatus.FAILED
    rq.bios.append(bio)
    rq.segments.extend(bio.segments)
    rq.nr_sectors += bio.nr_sectors
    rq.nr_phys_segments += segments
    return MergeStatus.OK


def attempt_front_merge(rq: Request, bio: Bio, limits: QueueLimits) -> MergeStatus:
    """Prepend ``bio`` to ``rq``; the request now starts at the bio's sector."""
    segments = count_phys_segments(bio.segments, limits.max_segment_size)
    if not _fits(rq, bio.nr_sectors, segments, limits):
        rq.no_merge = True
        return MergeStatus.FAILED
    rq.bios.insert(0, bio)
    rq.segments[:0] = bio.segments
    rq.sector = bio.sector
    rq.nr_sectors += bio.nr_sectors
    rq.nr_phys_segments += segments
    return MergeStatus.OK


def attempt_bio_merge(
    rq: Request, bio: Bio, limits: QueueLimits, boundaries: Sequence[int]
) -> tuple[MergeStatus, MergeType]:
    """Try to merge ``bio`` into ``rq`` (blk_attempt_bio_merge)."""
    if not rq_merge_ok(rq, bio, limits, boundaries):
        return MergeStatus.NONE, MergeType.NONE
    kind = try_merge(rq, bio)
    if kind is MergeType.BACK:
        return attempt_back_merge(rq, bio, limits), kind
    if kind is MergeType.FRONT:
        return attempt_front_merge(rq, bio, limits), kind
    return MergeStatus.NONE, kind


def requests_merge_ok(
    rq: Request, next_rq: Request, limits: QueueLimits, boundaries: Sequence[int]
) -> bool:
    """Whether ``next_rq`` may be absorbed by ``rq`` (the checks of attempt_merge).

    Used when a bio fills the gap between two queued requests. Requests with
    ordering edges never merge: joining them could make a request wait for itself.
    """
    if limits.nomerges != 0 or rq is next_rq:
        return False
    if not rq_mergeable(rq) or not rq_mergeable(next_rq):
        return False
    if rq.ordered or next_rq.ordered or rq.op is not next_rq.op:
        return False
    if rq.end_sector != next_rq.sector:
        return False
    if not _fits(rq, next_rq.nr_sectors, next_rq.nr_phys_segments, limits):
        return False
    return not crosses_boundary(rq.sector, next_rq.end_sector, boundaries)


def attempt_merge(
    rq: Request, next_rq: Request, limits: QueueLimits, boundaries: Sequence[int]
) -> bool:
    """Absorb ``next_rq`` into ``rq`` if allowed; the caller drops ``next_rq``."""
    if not requests_merge_ok(rq, next_rq, limits, boundaries):
        return False
    rq.bios.extend(next_rq.bios)
    rq.segments.extend(next_rq.segments)
    rq.nr_sectors += next_rq.nr_sectors
    rq.nr_phys_segments += next_rq.nr_phys_segments
    rq.start_time = min(rq.start_time, next_rq.start_time)
    if next_rq.fifo_deadline and (not rq.fifo_deadline or next_rq.fifo_deadline < rq.fifo_deadline):
        rq.fifo_deadline = next_rq.fifo_deadline
    return True
