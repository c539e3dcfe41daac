"""A byte-range lock: shared holders overlap freely, an exclusive holder excludes overlaps.

Writes and reads hold their range shared; a read-modify-write of a partial data
unit holds that unit exclusive, so no other I/O touches the unit between the
read and the write (Ceph RBD's rule for unaligned writes).
"""

from __future__ import annotations

from collections.abc import Sequence

from app.blk.wait import WaitQueue, WouldBlock


class RangeLock:
    def __init__(self) -> None:
        self._cond = WaitQueue()
        self._held: list[tuple[int, int, bool]] = []

    def _conflicts(self, entries: Sequence[tuple[int, int, bool]]) -> bool:
        for start, end, exclusive in entries:
            for held_start, held_end, held_exclusive in self._held:
                if held_start < end and start < held_end and (exclusive or held_exclusive):
                    return True
        return False

    def hold(self, start: int, end: int, *, exclusive: bool) -> _Hold:
        return _Hold(self, ((start, end, exclusive),), wait=True)

    def hold_shared(self, ranges: Sequence[tuple[int, int]], *, wait: bool = True) -> _Hold:
        """Many shared ranges taken at once (a batch of I/Os): all or nothing, one wake-up.
        ``wait=False``: WouldBlock instead of waiting for an exclusive holder."""
        return _Hold(self, [(start, end, False) for start, end in ranges], wait=wait)

    def _take(self, entries: Sequence[tuple[int, int, bool]], wait: bool) -> None:
        with self._cond:
            while self._conflicts(entries):
                if not wait:
                    raise WouldBlock
                self._cond.wait()
            self._held.extend(entries)

    def _give_back(self, entries: Sequence[tuple[int, int, bool]]) -> None:
        with self._cond:
            for entry in entries:
                self._held.remove(entry)
            self._cond.notify_all()


class _Hold:
    """The ranges held for a ``with`` block: a class, not a generator context manager, as
    every I/O takes one (a third of the cost)."""

    __slots__ = ("_entries", "_lock", "_wait")

    def __init__(
        self, lock: RangeLock, entries: Sequence[tuple[int, int, bool]], *, wait: bool
    ) -> None:
        self._lock = lock
        self._entries = entries
        self._wait = wait

    def __enter__(self) -> None:
        self._lock._take(self._entries, self._wait)

    def __exit__(self, *_: object) -> None:
        self._lock._give_back(self._entries)
