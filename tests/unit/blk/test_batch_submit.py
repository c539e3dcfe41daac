"""``submit_bios`` decides as the bio-at-a-time reference does, on seeded random traces:
the same requests, merges, dependency edges, plug generations, dispatch order and
statistics, with the queue held (batch against ``submit_bio`` one by one) and dispatching
(batch fast path against ``_place_locked`` per bio)."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any

import pytest

from app.blk import Bio, BlockQueue, DeadlineElevator, Op, QueueLimits, Request
from app.blk.queue import _CHUNK_SHIFT
from app.vocab import DispatchMode, ElevatorName

from .helpers import SECTOR, RecordingDevice

SEEDS = range(60)
#: Statistics that are counts, not times: equal run for run.
COUNTERS = ("ios", "bios", "merges", "sectors", "bios_done")
TOTALS = ("front_merges", "back_merges", "request_merges", "in_flight", "queued", "on_device")


def random_setup(rng: random.Random) -> dict[str, Any]:
    block = rng.choice((512, 512, 4096))
    limits = QueueLimits(
        max_sectors_kb=rng.choice((4, 16, 64, 1280)) if block == 512 else rng.choice((16, 1280)),
        max_segments=rng.choice((2, 4, 128)),
        max_segment_size=rng.choice((4096, 65536)),
        logical_block_size=block,
        nomerges=rng.choice((0, 0, 1, 2)),
        nr_requests=rng.choice((2, 8, 128)),
    )
    step = block // SECTOR
    boundaries = sorted({rng.randrange(1, 64) * step for _ in range(rng.choice((0, 0, 1, 3)))})
    return {
        "limits": limits,
        "boundaries": boundaries,
        "dispatch_mode": rng.choice(("request", "request", "bio")),
        "elevator": rng.choice(("none", "mq-deadline")),
        "queue_depth": rng.choice((1, 4, 32)),
    }


def random_trace(rng: random.Random, block_sectors: int) -> list[list[tuple[Any, ...]]]:
    """Batches of bio descriptions: op, sector, sectors, segment sizes, flags. Small
    addresses (a few 1 MiB overlap chunks) so that bios overlap, abut and merge."""
    batches = []
    last_start = last_end = 0
    for _ in range(rng.randrange(1, 6)):
        batch = []
        for _ in range(rng.randrange(1, 40)):
            op = rng.choices(
                (Op.READ, Op.WRITE, Op.DISCARD, Op.WRITE_ZEROES, Op.FLUSH), (35, 45, 6, 4, 3)
            )[0]
            if op is Op.FLUSH:
                batch.append((op, 0, 0, (), {}))
                continue
            blocks = rng.choice((1, 1, 2, 8, 8, 8, rng.randrange(1, 80)))
            nr_sectors = blocks * block_sectors
            start = rng.choice((rng.randrange(0, 256), rng.randrange(1900, 2200), 4090))
            sector = start // block_sectors * block_sectors
            streaming = rng.random()
            if streaming < 0.3:
                sector = last_end  # a sequential stream: back merges
            elif streaming < 0.4 and last_start >= nr_sectors:
                sector = last_start - nr_sectors  # a descending one: front merges
            last_start, last_end = sector, sector + nr_sectors
            sizes: list[int] = []
            if op in (Op.READ, Op.WRITE):
                left = blocks  # segments of whole logical blocks, as the kernel's bvecs
                while left:
                    size = left if rng.random() < 0.8 else rng.randrange(1, left + 1)
                    sizes.append(size * block_sectors * SECTOR)
                    left -= size
            flags = {
                "fua": op is Op.WRITE and rng.random() < 0.05,
                "preflush": op is Op.WRITE and rng.random() < 0.03,
                "no_merge": rng.random() < 0.03,
            }
            batch.append((op, sector, nr_sectors, tuple(sizes), flags))
        batches.append(batch)
    return batches


def make_bios(batch: Sequence[tuple[Any, ...]]) -> list[Bio]:
    return [
        Bio(op, sector, nr_sectors, [memoryview(bytearray(size)) for size in sizes], **flags)
        for op, sector, nr_sectors, sizes, flags in batch
    ]


def describe(rq: Request, names: Names) -> tuple[Any, ...]:
    return (
        rq.op,
        rq.sector,
        rq.nr_sectors,
        [names.of(bio) for bio in rq.bios],
        [segment.nbytes for segment in rq.segments],
        rq.nr_phys_segments,
        rq.fua,
        rq.preflush,
        rq.no_merge,
        rq.ordered,
        rq.wait_count,
        rq.state,
    )


def counters(queue: BlockQueue) -> dict[str, Any]:
    snapshot = queue.stats.snapshot()
    kept = {key: snapshot[key] for key in TOTALS}
    for group in "rwdf":
        for name in COUNTERS:
            kept[f"{group}_{name}"] = snapshot[f"{group}_{name}"]
    kept["histogram"] = snapshot["request_size_histogram"]
    return kept


class Names(dict[int, int]):
    """Bios by their place in the trace; a split half is named after the bio it came from."""

    def __init__(self, bios: list[Bio]) -> None:
        super().__init__((id(bio), number) for number, bio in enumerate(bios))

    def of(self, bio: Bio) -> int:
        while id(bio) not in self:
            assert bio.parent is not None
            bio = bio.parent
        return self[id(bio)]


def queue_state(queue: BlockQueue, bios: list[Bio]) -> dict[str, Any]:
    """What a held queue holds: its requests in elevator order with their edges, the
    plug, the merge hash and the overlap index, and each bio's plug generation."""
    names = Names(bios)
    pending = list(queue._pending)
    number = {id(rq): position for position, rq in enumerate(pending)}
    return {
        "pending": [describe(rq, names) for rq in pending],
        "edges": [[number[id(d)] for d in rq.dependents] for rq in pending],
        "elevator": [number[id(rq)] for rq in queue._elevator.requests()],
        "plug": [number[id(rq)] for rq in queue._plug.requests],
        "by_end": sorted((op, end, number[id(rq)]) for (op, end), rq in queue._by_end.items()),
        "by_start": sorted((op, s, number[id(rq)]) for (op, s), rq in queue._by_start.items()),
        "overlap": sorted(
            (chunk, sorted(number[id(rq)] for rq in bucket))
            for chunk, bucket in queue._overlap.items()
        ),
        "last_merge": None if queue._last_merge is None else number[id(queue._last_merge)],
        "scheduled": queue._scheduled,
        "generations": [bio.plug_generation for bio in bios],
        "unplug": [bio.unplug is not None for bio in bios],
        "stats": counters(queue),
    }


def run_trace(
    setup: dict[str, Any], trace: list[list[tuple[Any, ...]]], *, batched: bool, held: bool
) -> dict[str, Any]:
    limits: QueueLimits = setup["limits"]
    device = RecordingDevice(8192, limits, tuple(setup["boundaries"]))
    mode: DispatchMode = setup["dispatch_mode"]
    elevator: ElevatorName = setup["elevator"]
    queue = BlockQueue(
        device.dispatch,
        limits=limits,
        boundaries=setup["boundaries"],
        dispatch_mode=mode,
        elevator=elevator,
        plug_window_us=0,
        queue_depth=setup["queue_depth"],
    )
    if isinstance(queue._elevator, DeadlineElevator):
        # FIFO expiry is wall-clock time: on a loaded machine it would decide differently
        # from run to run.
        queue._elevator.expire_ns = (1 << 62, 1 << 62)
    if held:
        queue.hold()
    every: list[Bio] = []
    states = []
    for batch in trace:
        bios = make_bios(batch)
        every.extend(bios)
        if batched:
            queue.submit_bios(bios)
        else:
            for bio in bios:
                queue.submit_bio(bio)
            queue.finish_plug()
        if held:
            states.append(queue_state(queue, every))
    if held:
        queue.release()  # one thread dispatches everything: the order is the elevator's
        deadline = time.monotonic() + 10
        while queue.in_flight and time.monotonic() < deadline:
            time.sleep(0.001)
    else:
        assert queue.drain(10)
    names = Names(every)
    assert all(bio.done.is_set() for bio in every)
    return {
        "held_states": states,
        "dispatched": [
            (rq.op, rq.sector, rq.nr_sectors, [names.of(bio) for bio in rq.bios])
            for rq in device.requests
        ],
        "violations": device.violations,
        "stats": counters(queue),
        "statuses": [repr(bio.status) for bio in every],
    }


def reference_place_batch(queue: BlockQueue, bios: Sequence[Bio], now: int) -> None:
    """The batch placed bio by bio through the general path (``_place_locked``)."""
    for bio in bios:
        if not bio.submit_time:
            bio.submit_time = now
        queue._place_locked(bio, queue._split_to_limits(bio), now)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_held_batch_decides_as_submit_bio_one_by_one(seed: int) -> None:
    rng = random.Random(seed)
    setup = random_setup(rng)
    trace = random_trace(rng, setup["limits"].logical_block_sectors)
    batched = run_trace(setup, trace, batched=True, held=True)
    assert batched == run_trace(setup, trace, batched=False, held=True)
    assert not batched["violations"]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_dispatching_batch_decides_as_the_general_path(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(1000 + seed)
    setup = random_setup(rng)
    trace = random_trace(rng, setup["limits"].logical_block_sectors)
    batched = run_trace(setup, trace, batched=True, held=False)
    with monkeypatch.context() as patched:
        patched.setattr(BlockQueue, "_place_batch_locked", reference_place_batch)
        reference = run_trace(setup, trace, batched=True, held=False)
    assert batched == reference
    assert not batched["violations"]


def test_the_traces_reach_the_fast_paths_decisions() -> None:
    """The random traces hold what the fast path must decide: merges both ways, conflicts
    inside one overlap chunk and across two, plug flushes at the request count."""
    rng = random.Random(7)
    setup = {
        "limits": QueueLimits(),
        "boundaries": [],
        "dispatch_mode": "request",
        "elevator": "none",
        "queue_depth": 32,
    }
    seen = {"back": 0, "front": 0, "conflict": 0, "two_chunks": 0}
    for _ in range(20):
        trace = random_trace(rng, 1)
        result = run_trace(setup, trace, batched=True, held=True)
        stats = result["stats"]
        seen["back"] += stats["back_merges"]
        seen["front"] += stats["front_merges"]
        state = result["held_states"][-1]
        seen["conflict"] += sum(1 for edges in state["edges"] if edges)
        seen["two_chunks"] += sum(
            1
            for rq in state["pending"]
            if rq[1] >> _CHUNK_SHIFT != (rq[1] + rq[2] - 1) >> _CHUNK_SHIFT
        )
    assert all(seen.values()), seen
