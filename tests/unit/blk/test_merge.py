import pytest

from app.blk import (
    Bio,
    MergeStatus,
    MergeType,
    Op,
    QueueLimits,
    Request,
    attempt_back_merge,
    attempt_bio_merge,
    attempt_front_merge,
    attempt_merge,
    rq_merge_ok,
    try_merge,
)

from .helpers import read_bio, write_bio

LIMITS = QueueLimits()


def request(bio: Bio, limits: QueueLimits = LIMITS) -> Request:
    return Request.from_bio(bio, limits.max_segment_size)


def test_back_merge_appends_bio_and_segments():
    rq = request(write_bio(0, 8, fill=1))
    bio = write_bio(8, 8, fill=2)
    assert try_merge(rq, bio) is MergeType.BACK
    assert attempt_back_merge(rq, bio, LIMITS) is MergeStatus.OK
    assert (rq.sector, rq.nr_sectors, rq.nr_phys_segments) == (0, 16, 2)
    assert rq.segments[1] is bio.segments[0]  # zero-copy: the same view


def test_front_merge_prepends_and_moves_start():
    rq = request(write_bio(8, 8, fill=1))
    bio = write_bio(0, 8, fill=2)
    assert try_merge(rq, bio) is MergeType.FRONT
    assert attempt_front_merge(rq, bio, LIMITS) is MergeStatus.OK
    assert (rq.sector, rq.nr_sectors) == (0, 16)
    assert rq.bios[0] is bio
    assert rq.segments[0] is bio.segments[0]


def test_non_contiguous_bio_is_no_merge():
    rq = request(write_bio(0, 8))
    assert try_merge(rq, write_bio(9, 8)) is MergeType.NONE
    assert attempt_bio_merge(rq, write_bio(9, 8), LIMITS, ())[0] is MergeStatus.NONE


def test_op_mismatch_is_refused():
    assert not rq_merge_ok(request(write_bio(0, 8)), read_bio(8, 8), LIMITS, ())


@pytest.mark.parametrize("op", [Op.FLUSH, Op.WRITE_ZEROES])
def test_flush_and_write_zeroes_never_merge(op):
    rq = Request(op, 0, 8, [], [], 0)
    assert not rq_merge_ok(rq, Bio(op, 8, 8), LIMITS, ())


def test_contiguous_discards_merge():
    rq = request(Bio(Op.DISCARD, 0, 8))
    status, kind = attempt_bio_merge(rq, Bio(Op.DISCARD, 8, 8), LIMITS, ())
    assert (status, kind, rq.nr_sectors) == (MergeStatus.OK, MergeType.BACK, 16)


@pytest.mark.parametrize("flag", ["fua", "preflush", "no_merge"])
def test_barrier_bios_do_not_merge(flag):
    rq = request(write_bio(0, 8))
    assert not rq_merge_ok(rq, write_bio(8, 8, **{flag: True}), LIMITS, ())
    barrier_rq = request(write_bio(0, 8, **{flag: True}))
    assert not rq_merge_ok(barrier_rq, write_bio(8, 8), LIMITS, ())


def test_max_sectors_fails_and_marks_request_full():
    limits = QueueLimits(max_sectors_kb=8)
    rq = request(write_bio(0, 16), limits)
    assert attempt_bio_merge(rq, write_bio(16, 1), limits, ())[0] is MergeStatus.FAILED
    assert rq.no_merge
    assert not rq_merge_ok(rq, write_bio(16, 1), limits, ())


def test_max_segments_fails():
    limits = QueueLimits(max_segments=2)
    rq = request(Bio(Op.WRITE, 0, 2, [memoryview(bytes(512)), memoryview(bytes(512))]), limits)
    assert rq.nr_phys_segments == 2
    assert attempt_bio_merge(rq, write_bio(2, 1), limits, ())[0] is MergeStatus.FAILED


def test_segment_larger_than_max_segment_size_counts_as_several():
    limits = QueueLimits(max_segment_size=4096)
    assert request(write_bio(0, 32), limits).nr_phys_segments == 4


def test_merge_never_spans_a_boundary():
    rq = request(write_bio(0, 8))
    assert not rq_merge_ok(rq, write_bio(8, 8), LIMITS, (8,))
    assert rq_merge_ok(rq, write_bio(8, 8), LIMITS, (16,))
    front_rq = request(write_bio(8, 8))
    assert not rq_merge_ok(front_rq, write_bio(0, 8), LIMITS, (4, 8))


def test_nomerges_2_disables_rq_merge_ok():
    rq = request(write_bio(0, 8))
    assert not rq_merge_ok(rq, write_bio(8, 8), QueueLimits(nomerges=2), ())


def test_gap_filling_merges_the_two_requests():
    first = request(write_bio(0, 8))
    second = request(write_bio(16, 8))
    assert attempt_back_merge(first, write_bio(8, 8), LIMITS) is MergeStatus.OK
    assert attempt_merge(first, second, LIMITS, ())
    assert (first.sector, first.nr_sectors, len(first.bios)) == (0, 24, 3)


@pytest.mark.parametrize(
    ("limits", "boundaries", "second_sector"),
    [
        (QueueLimits(max_sectors_kb=4), (), 8),  # too big together
        (LIMITS, (8,), 8),  # across a boundary
        (LIMITS, (), 9),  # not contiguous
        (QueueLimits(nomerges=1), (), 8),  # request merges are lookup merges
    ],
)
def test_request_merge_refusals(limits, boundaries, second_sector):
    assert not attempt_merge(
        request(write_bio(0, 8)), request(write_bio(second_sector, 8)), limits, boundaries
    )


def test_ordered_requests_do_not_merge():
    first, second = request(write_bio(0, 8)), request(write_bio(8, 8))
    second.ordered = True
    assert not attempt_merge(first, second, LIMITS, ())
