"""Shared helpers for blk tests: bios with recognisable payloads and a recording device."""

from __future__ import annotations

import threading

from app.blk import Bio, Op, QueueLimits, Request
from app.blk.merge import crosses_boundary

SECTOR = 512


def write_bio(sector: int, nr_sectors: int, fill: int = 1, **flags: bool) -> Bio:
    return Bio(
        Op.WRITE, sector, nr_sectors, [memoryview(bytes([fill]) * (nr_sectors * SECTOR))], **flags
    )


def read_bio(sector: int, nr_sectors: int) -> Bio:
    return Bio(Op.READ, sector, nr_sectors, [memoryview(bytearray(nr_sectors * SECTOR))])


def run(queue, bios):
    """Submit ``bios``, flush the plug, wait for every one."""
    for bio in bios:
        queue.submit_bio(bio)
    queue.finish_plug()
    for bio in bios:
        bio.wait(5)


class RecordingDevice:
    """An in-memory disk whose ``dispatch`` applies requests and records them."""

    def __init__(
        self,
        nr_sectors: int = 4096,
        limits: QueueLimits | None = None,
        boundaries: tuple[int, ...] = (),
    ) -> None:
        self.data = bytearray(nr_sectors * SECTOR)
        self.limits = limits or QueueLimits()
        self.boundaries = boundaries
        self.requests: list[Request] = []
        self.violations: list[str] = []
        self.lock = threading.Lock()

    def check(self, rq: Request) -> None:
        if rq.op is Op.FLUSH:
            return
        if rq.nr_sectors > self.limits.max_sectors:
            self.violations.append(f"{rq} exceeds max_sectors")
        if rq.nr_phys_segments > self.limits.max_segments:
            self.violations.append(f"{rq} exceeds max_segments")
        if crosses_boundary(rq.sector, rq.end_sector, self.boundaries):
            self.violations.append(f"{rq} crosses a boundary")
        sector = rq.sector
        for bio in rq.bios:
            if bio.op is not rq.op or bio.sector != sector:
                self.violations.append(f"{rq} holds a non-contiguous bio")
            sector += bio.nr_sectors
        if sector != rq.end_sector:
            self.violations.append(f"{rq} bios do not add up")
        if rq.op in (Op.READ, Op.WRITE):
            size = sum(segment.nbytes for segment in rq.segments)
            if size != rq.nr_bytes:
                self.violations.append(f"{rq} segments hold {size} bytes")

    def dispatch(self, rq: Request) -> None:
        self.check(rq)
        offset = rq.sector * SECTOR
        if rq.op is Op.WRITE:
            for segment in rq.segments:
                self.data[offset : offset + segment.nbytes] = segment
                offset += segment.nbytes
        elif rq.op is Op.READ:
            for segment in rq.segments:
                segment[:] = self.data[offset : offset + segment.nbytes]
                offset += segment.nbytes
        elif rq.op in (Op.DISCARD, Op.WRITE_ZEROES):
            self.data[offset : offset + rq.nr_bytes] = bytes(rq.nr_bytes)
        with self.lock:
            self.requests.append(rq)

    def spans(self) -> list[tuple[Op, int, int]]:
        return [(rq.op, rq.sector, rq.nr_sectors) for rq in self.requests]
