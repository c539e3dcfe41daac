"""Which engine calls a request becomes: pure, no I/O, no clock.

The rules (dm-crypt's bio path, the request-based RFC and ``CRYPTO_ALG_BULK``):

- the engine derives every data unit's IV from one starting IV
  (``Capabilities.fallback_reason`` is None): one *bulk* call per chunk of at
  most ``max_bytes_per_call`` bytes and ``max_segments_per_call`` segments, cut
  on data-unit boundaries; over the whole request in ``request`` mode, over
  each bio on its own in ``bio`` mode;
- otherwise one call per data unit, its IV computed by the CPU (the RFC's
  fallback), whatever the dispatch mode.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from app.engine import _model
from app.engine.model import Capabilities, SpecLike
from app.errors import InvalidInput
from app.vocab import SECTOR_SIZE, CipherOp, DispatchMode

__all__ = ["CallPlan", "EngineCall", "plan_calls"]


@dataclass(frozen=True, slots=True)
class EngineCall:
    """One call into the engine: a byte range of the request, cut on data units.

    ``bulk`` calls carry one starting IV and the engine derives the rest;
    per-unit calls (``bulk=False``) cover exactly one data unit whose IV the
    CPU generated. ``sector`` is in the request's frame (512-byte sectors).
    """

    bulk: bool
    offset: int
    nbytes: int
    sector: int
    nr_units: int
    first_segment: int
    nr_segments: int


@dataclass(frozen=True, slots=True)
class CallPlan:
    """The calls for one request, in order, and why they are bulk or not."""

    op: CipherOp
    dispatch_mode: DispatchMode
    data_unit_size: int
    nbytes: int
    calls: tuple[EngineCall, ...]
    fallback_reason: str | None

    @property
    def bulk(self) -> bool:
        return self.fallback_reason is None

    @property
    def bulk_calls(self) -> int:
        return len(self.calls) if self.bulk else 0

    @property
    def unit_calls(self) -> int:
        return 0 if self.bulk else len(self.calls)

    @property
    def cpu_iv_units(self) -> int:
        """Data units whose IV the CPU computes: all of them on the fallback path."""
        return 0 if self.bulk else self.nbytes // self.data_unit_size


def plan_calls(
    capabilities: Capabilities,
    spec: SpecLike,
    segments: Sequence[int],
    *,
    op: CipherOp,
    data_unit_size: int,
    dispatch_mode: DispatchMode,
    sector: int = 0,
    bios: Sequence[tuple[int, int]] | None = None,
) -> CallPlan:
    """Plan the engine calls for a request of ``segments`` (byte sizes) at ``sector``.

    ``bios`` are the request's bios as ``(sector, nr_sectors)``, contiguous from
    ``sector``; only bio mode looks at them (``None``: the request is one bio).
    Raises ``InvalidInput`` if the engine cannot run the spec at all or the
    geometry is not whole, aligned data units.
    """
    unsupported = capabilities.unsupported_reason(spec, data_unit_size)
    if unsupported is not None:
        raise InvalidInput(f"engine cannot process this volume: {unsupported}")
    ends = [segments[0]] if len(segments) == 1 else list(accumulate(segments))
    nbytes = ends[-1] if ends else 0
    _check_geometry(segments, nbytes, sector, data_unit_size)
    reason = capabilities.fallback_reason(spec)
    if (
        reason is None
        and len(ends) == 1
        and (dispatch_mode == "request" or bios is None or len(bios) == 1)
        and nbytes <= capabilities.max_bytes_per_call
    ):
        # One segment that fits one call (a lone small bio): what _bulk_calls would plan.
        call = EngineCall(True, 0, nbytes, sector, nbytes // data_unit_size, 0, 1)
        if dispatch_mode == "bio":
            _bio_regions(bios, sector, nbytes, data_unit_size)
        return CallPlan(op, dispatch_mode, data_unit_size, nbytes, (call,), None)
    if reason is not None:
        calls = _unit_calls(ends, nbytes, sector, data_unit_size)
    else:
        regions = [(0, nbytes)]
        if dispatch_mode == "bio":
            regions = _bio_regions(bios, sector, nbytes, data_unit_size)
        calls = []
        for start, end in regions:
            calls.extend(_bulk_calls(capabilities, ends, start, end, sector, data_unit_size))
    return CallPlan(op, dispatch_mode, data_unit_size, nbytes, tuple(calls), reason)


def _check_geometry(segments: Sequence[int], nbytes: int, sector: int, unit: int) -> None:
    if not segments:
        raise InvalidInput("a request needs at least one segment")
    if min(segments) <= 0:
        raise InvalidInput("segment sizes must be positive")
    if nbytes % unit:
        raise InvalidInput(f"request of {nbytes} bytes is not a whole number of {unit}-byte units")
    if sector < 0 or (sector * SECTOR_SIZE) % unit:
        raise InvalidInput(f"sector {sector} is not aligned to the {unit}-byte data unit")


def _bio_regions(
    bios: Sequence[tuple[int, int]] | None, sector: int, nbytes: int, unit: int
) -> list[tuple[int, int]]:
    if bios is None:
        return [(0, nbytes)]
    regions: list[tuple[int, int]] = []
    offset = 0
    for bio_sector, nr_sectors in bios:
        length = nr_sectors * SECTOR_SIZE
        if bio_sector != sector + offset // SECTOR_SIZE or nr_sectors <= 0:
            raise InvalidInput("bios must be contiguous, non-empty and start at the request sector")
        if length % unit:
            raise InvalidInput(f"bio at sector {bio_sector} is not whole {unit}-byte units")
        regions.append((offset, offset + length))
        offset += length
    if offset != nbytes:
        raise InvalidInput(f"bios cover {offset} bytes, the segments {nbytes}")
    return regions


def _segments_touched(ends: list[int], start: int, end: int) -> tuple[int, int]:
    first = bisect_right(ends, start)
    last = bisect_left(ends, end)
    return first, last - first + 1


def _unit_calls(ends: list[int], nbytes: int, sector: int, unit: int) -> list[EngineCall]:
    calls = []
    step = unit // SECTOR_SIZE
    for index, offset in enumerate(range(0, nbytes, unit)):
        first, count = _segments_touched(ends, offset, offset + unit)
        calls.append(EngineCall(False, offset, unit, sector + index * step, 1, first, count))
    return calls


def _bulk_calls(
    capabilities: Capabilities, ends: list[int], start: int, end: int, sector: int, unit: int
) -> list[EngineCall]:
    calls = []
    max_bytes = capabilities.max_bytes_per_call // unit * unit
    max_segments = capabilities.max_segments_per_call
    offset = start
    while offset < end:
        first = bisect_right(ends, offset)
        stop = min(end, offset + max_bytes)
        last_allowed = first + max_segments - 1
        if last_allowed < len(ends) - 1:
            by_segments = offset + (ends[last_allowed] - offset) // unit * unit
            # A unit over more segments than allowed still goes alone: there is no smaller call.
            stop = min(stop, max(by_segments, offset + unit))
        _, count = _segments_touched(ends, offset, stop)
        length = stop - offset
        calls.append(
            EngineCall(
                True, offset, length, sector + offset // SECTOR_SIZE, length // unit, first, count
            )
        )
        offset = stop
    return calls


_model.bind_plan(EngineCall, CallPlan, InvalidInput)
