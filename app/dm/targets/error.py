"""``error``: every I/O fails (dm-error), as a device with bad media would."""

from __future__ import annotations

from app.blk.request import Request
from app.dm.targets.base import MapContext, MapResult, Target
from app.errors import TargetIOError
from app.vocab import Op


class ErrorTarget(Target):
    def map(self, request: Request, context: MapContext) -> MapResult:
        if request.op == Op.FLUSH:
            return MapResult()
        raise TargetIOError(
            f"I/O error: sectors {request.sector}..{request.sector + request.nr_sectors - 1} "
            "map to an error target"
        )
