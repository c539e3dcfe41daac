"""The neutral op type: what every front end turns its requests into."""

from __future__ import annotations

from dataclasses import dataclass

from app.vocab import Op


@dataclass(slots=True, eq=False)
class Io:
    """One I/O: ``op`` over ``length`` bytes at byte ``offset``, any alignment.

    ``buffer`` is what a read fills and what a write writes (``length`` bytes; None for
    flush, discard and write-zeroes). ``fua``: durable before it completes. The batch
    puts the I/O's failure in ``error`` (None: done). ``may_overwrite``: the submitter
    never reads a write's ``buffer`` again (it owns it and refills or drops it), so the
    data path may encrypt it in place instead of into pages of its own.
    """

    op: Op
    offset: int
    length: int
    buffer: memoryview | None = None
    fua: bool = False
    error: Exception | None = None
    may_overwrite: bool = False

    @classmethod
    def read(cls, offset: int, buffer: memoryview) -> Io:
        return cls(Op.READ, offset, len(buffer), buffer)

    @classmethod
    def write(
        cls, offset: int, data: memoryview, *, fua: bool = False, may_overwrite: bool = False
    ) -> Io:
        return cls(Op.WRITE, offset, len(data), data, fua, may_overwrite=may_overwrite)
