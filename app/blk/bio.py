"""Bios: one client I/O each, completed exactly once (possibly via split halves).

A bio carries its payload as a list of ``memoryview`` segments and is never
copied: merging concatenates segment lists and splitting slices views, so the
dispatcher reads from (WRITE) or fills (READ) the caller's own buffers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field

from app.blk.wait import Completion
from app.errors import InvalidInput
from app.vocab import SECTOR_SHIFT, Op

#: Operations that change the device: they order against every overlapping I/O.
WRITE_OPS = frozenset({Op.WRITE, Op.DISCARD, Op.WRITE_ZEROES})
#: Operations whose bios carry a payload that must match ``nr_sectors``.
DATA_OPS = frozenset({Op.READ, Op.WRITE})

_CHAIN_LOCK = threading.Lock()

#: ``unplug(bio, deadline)`` installed by the queue: called by a waiter before it
#: sleeps so that the plug holding the bio gets flushed (the kernel flushes a
#: task's plug when the task schedules).
UnplugHook = Callable[["Bio", float | None], None]


@dataclass(slots=True, eq=False)
class SectorOp:
    """An op on a run of 512-byte sectors, with its flags: what a bio and a request share.

    The flags are keyword-only; a request takes them from its first bio. ``end_sector``
    is the kernel's ``bio_end_sector``, ``nr_bytes`` its ``bi_size`` / ``blk_rq_bytes``.
    """

    op: Op
    sector: int
    nr_sectors: int
    _: KW_ONLY
    fua: bool = False
    preflush: bool = False
    no_merge: bool = False

    @property
    def end_sector(self) -> int:
        return self.sector + self.nr_sectors

    @property
    def nr_bytes(self) -> int:
        return self.nr_sectors << SECTOR_SHIFT


@dataclass(slots=True, eq=False)
class Bio(SectorOp):
    """One I/O: ``sector``/``nr_sectors`` in 512-byte units, volume-relative.

    ``may_overwrite``: the submitter never reads a write's segments again, so a target
    may transform them in place (the crypt target then needs no pages of its own).
    """

    segments: list[memoryview] = field(default_factory=list)
    status: BaseException | None = None
    done: Completion = field(default_factory=Completion, repr=False)
    submit_time: int = 0
    done_time: int = 0
    parent: Bio | None = field(default=None, repr=False)
    # Completions still owed before this bio ends: 1, plus 1 per split (bio_chain).
    remaining: int = field(default=1, repr=False)
    chained: bool = field(default=False, repr=False)
    plug_generation: int = field(default=-1, repr=False)
    unplug: UnplugHook | None = field(default=None, repr=False)
    may_overwrite: bool = False

    def wait(self, timeout: float | None = None) -> None:
        """Block until the bio completes; raise its error, or TimeoutError."""
        if not self.done.is_set():
            deadline = None if timeout is None else time.monotonic() + timeout
            unplug = self.unplug
            if unplug is not None:
                unplug(self, deadline)
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self.done.wait(remaining):
                raise TimeoutError(f"{self.op} bio at sector {self.sector} did not complete")
        if self.status is not None:
            raise self.status


def bio_endio(bio: Bio, status: BaseException | None = None) -> None:
    """Complete one outstanding piece of ``bio``; propagate up split chains.

    The first error wins, as the kernel keeps the parent's first bad status.
    """
    current: Bio | None = bio
    while current is not None:
        if status is not None and current.status is None:
            current.status = status
        if current.chained:
            with _CHAIN_LOCK:
                current.remaining -= 1
                left = current.remaining
            if left > 0:
                return
        else:
            current.remaining = 0
        current.done_time = time.perf_counter_ns()
        current.done.set()
        status = current.status
        current = current.parent


def _slice_segments(
    segments: list[memoryview], nr_bytes: int
) -> tuple[list[memoryview], list[memoryview]]:
    front: list[memoryview] = []
    back: list[memoryview] = []
    left = nr_bytes
    for index, segment in enumerate(segments):
        size = segment.nbytes
        if left >= size:
            front.append(segment)
            left -= size
            if left == 0:
                back.extend(segments[index + 1 :])
                break
            continue
        view = segment.cast("B") if segment.format != "B" or segment.ndim != 1 else segment
        front.append(view[:left])
        back.append(view[left:])
        back.extend(segments[index + 1 :])
        break
    return front, back


def bio_split(bio: Bio, nr_sectors: int) -> tuple[Bio, Bio]:
    """Split ``bio`` after ``nr_sectors``; ``bio`` then ends when both halves end.

    Halves share the caller's buffers (sliced views). Preflush applies only to
    the front half (the cache is flushed once, before the first byte); FUA to both.
    """
    if not 0 < nr_sectors < bio.nr_sectors:
        raise InvalidInput(f"cannot split a {bio.nr_sectors}-sector bio at {nr_sectors}")
    if bio.segments:
        front_segments, back_segments = _slice_segments(bio.segments, nr_sectors << SECTOR_SHIFT)
    else:
        front_segments, back_segments = [], []
    front = Bio(
        bio.op,
        bio.sector,
        nr_sectors,
        front_segments,
        fua=bio.fua,
        preflush=bio.preflush,
        no_merge=bio.no_merge,
        may_overwrite=bio.may_overwrite,
        submit_time=bio.submit_time,
        parent=bio,
    )
    back = Bio(
        bio.op,
        bio.sector + nr_sectors,
        bio.nr_sectors - nr_sectors,
        back_segments,
        fua=bio.fua,
        no_merge=bio.no_merge,
        may_overwrite=bio.may_overwrite,
        submit_time=bio.submit_time,
        parent=bio,
    )
    with _CHAIN_LOCK:
        bio.remaining += 1
        bio.chained = True
    return front, back
