"""``zero``: reads return zeros, writes are dropped (dm-zero)."""

from __future__ import annotations

from app.blk.request import Request
from app.dm.targets.base import MapContext, MapResult, Target
from app.vocab import Op


class ZeroTarget(Target):
    def map(self, request: Request, context: MapContext) -> MapResult:
        if request.op == Op.READ:
            for segment in request.segments:
                segment[:] = bytes(len(segment))
        return MapResult()
