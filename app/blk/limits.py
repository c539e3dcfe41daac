"""Queue limits: the sysfs ``queue/`` knobs that bound merging and splitting."""

from __future__ import annotations

from dataclasses import dataclass

from app.errors import InvalidInput

#: The kernel refuses segment sizes below a page (BLK_MIN_SEGMENT_SIZE).
MIN_SEGMENT_SIZE = 4096
MAX_SECTORS_KB_LIMIT = 65536
#: BLKDEV_DEFAULT_RQ: the scheduler's own depth when nobody sets ``nr_requests``.
DEFAULT_NR_REQUESTS = 128
MAX_NR_REQUESTS = 65536


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """Per-queue limits; ``nomerges`` follows sysfs: 0 all merges, 1 only the
    simple one-hit merges (last request, plug), 2 none at all. ``nr_requests``
    bounds the requests the scheduler holds (plugged or queued, not yet on the
    device): a submitter needing one more waits, as for a scheduler tag."""

    max_sectors_kb: int = 1280
    max_segments: int = 128
    max_segment_size: int = 65536
    logical_block_size: int = 512
    nomerges: int = 0
    nr_requests: int = DEFAULT_NR_REQUESTS

    @property
    def max_sectors(self) -> int:
        """Largest request in sectors (rounded down to the logical block, as the kernel does)."""
        block_sectors = self.logical_block_size >> 9
        return (self.max_sectors_kb * 2) // block_sectors * block_sectors

    @property
    def logical_block_sectors(self) -> int:
        return self.logical_block_size >> 9

    def validate(self) -> QueueLimits:
        """Refuse values the kernel would refuse; returns ``self`` for chaining."""
        size = self.logical_block_size
        if size < 512 or size > 4096 or size & (size - 1):
            raise InvalidInput("logical_block_size must be a power of two between 512 and 4096")
        if self.max_sectors_kb * 1024 < size:
            raise InvalidInput("max_sectors_kb must hold at least one logical block")
        if self.max_sectors_kb > MAX_SECTORS_KB_LIMIT:
            raise InvalidInput(f"max_sectors_kb must be at most {MAX_SECTORS_KB_LIMIT}")
        if not 1 <= self.max_segments <= 65535:
            raise InvalidInput("max_segments must be between 1 and 65535")
        if self.max_segment_size < MIN_SEGMENT_SIZE or self.max_segment_size > 1 << 31:
            raise InvalidInput(f"max_segment_size must be between {MIN_SEGMENT_SIZE} and 2^31")
        if self.nomerges not in (0, 1, 2):
            raise InvalidInput("nomerges must be 0, 1 or 2")
        if not 1 <= self.nr_requests <= MAX_NR_REQUESTS:
            raise InvalidInput(f"nr_requests must be between 1 and {MAX_NR_REQUESTS}")
        return self
