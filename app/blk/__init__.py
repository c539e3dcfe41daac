"""Block layer: bios, requests, queue limits, plug/merge, elevators, statistics.

Owns how client I/Os become dispatched requests and in what order. Knows
nothing about ciphers, targets, HTTP or SQL: it must not import fastapi,
sqlalchemy, app.crypto, app.engine or app.dm (only app.errors and app.vocab).
"""

from app.blk.bio import Bio, bio_endio, bio_split
from app.blk.elevator import DeadlineElevator, Elevator, NoneElevator, make_elevator
from app.blk.limits import QueueLimits
from app.blk.merge import (
    MergeStatus,
    MergeType,
    attempt_back_merge,
    attempt_bio_merge,
    attempt_front_merge,
    attempt_merge,
    rq_merge_ok,
    try_merge,
)
from app.blk.plug import BLK_MAX_REQUEST_COUNT, BLK_PLUG_FLUSH_SIZE, Plug
from app.blk.queue import BlockQueue
from app.blk.request import Request, count_phys_segments
from app.blk.stats import QueueStats
from app.vocab import Op

__all__ = [
    "BLK_MAX_REQUEST_COUNT",
    "BLK_PLUG_FLUSH_SIZE",
    "Bio",
    "BlockQueue",
    "DeadlineElevator",
    "Elevator",
    "MergeStatus",
    "MergeType",
    "NoneElevator",
    "Op",
    "Plug",
    "QueueLimits",
    "QueueStats",
    "Request",
    "attempt_back_merge",
    "attempt_bio_merge",
    "attempt_front_merge",
    "attempt_merge",
    "bio_endio",
    "bio_split",
    "count_phys_segments",
    "make_elevator",
    "rq_merge_ok",
    "try_merge",
]
