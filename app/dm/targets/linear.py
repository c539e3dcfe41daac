"""``linear``: sectors map one to one onto a device range (dm-linear)."""

from __future__ import annotations

from app.blk.request import Request
from app.dm.targets.base import (
    BlockDevice,
    MapContext,
    MapResult,
    Started,
    Target,
    finish_io,
    finished,
)
from app.vocab import SECTOR_SHIFT, Op

_NOTHING = MapResult()


class LinearTarget(Target):
    def __init__(self, start: int, length: int, device: BlockDevice, offset: int) -> None:
        super().__init__(start, length)
        self.device = device
        self.offset = offset

    @property
    def prompt(self) -> bool:
        return self.device.prompt

    def _device_offset(self, request: Request) -> int:
        return (self.offset + request.sector - self.start) << SECTOR_SHIFT

    def map(self, request: Request, context: MapContext) -> MapResult:
        return finished(self.submit(request, context))

    def submit(self, request: Request, context: MapContext) -> Started:
        position = self._device_offset(request)
        if request.op in (Op.READ, Op.WRITE):
            if request.op == Op.READ:
                wait = self.device.submit_readv(position, request.segments)
            else:
                wait = self.device.submit_writev(position, request.segments)
            return finish_io(self.device, request, wait, _NOTHING)
        if request.op in (Op.DISCARD, Op.WRITE_ZEROES):
            length = request.nr_sectors << SECTOR_SHIFT
            if request.op == Op.DISCARD:
                self.device.discard(position, length)
            else:
                self.device.write_zeroes(position, length)
        if request.fua:
            self.device.flush()
        return _NOTHING

    def flush(self) -> None:
        self.device.flush()
