import pytest

from app.blk import Bio, Op, bio_endio, bio_split
from app.errors import InvalidInput, TargetIOError

from .helpers import write_bio


def test_split_slices_segments_without_copying():
    buffer = bytearray(range(256)) * 16  # 4096 bytes
    bio = Bio(Op.WRITE, 10, 8, [memoryview(buffer)[:1000], memoryview(buffer)[1000:]])
    front, back = bio_split(bio, 3)
    assert (front.sector, front.nr_sectors, back.sector, back.nr_sectors) == (10, 3, 13, 5)
    assert sum(s.nbytes for s in front.segments) == 1536
    assert sum(s.nbytes for s in back.segments) == 2560
    assert b"".join(bytes(s) for s in front.segments + back.segments) == bytes(buffer)
    buffer[1500] = 0xEE
    assert bytes(front.segments[1])[500] == 0xEE  # a view, not a copy


def test_split_keeps_preflush_on_front_and_fua_on_both():
    bio = write_bio(0, 8, fua=True, preflush=True)
    front, back = bio_split(bio, 4)
    assert front.preflush
    assert not back.preflush
    assert front.fua
    assert back.fua


def test_parent_completes_only_when_both_halves_complete():
    bio = write_bio(0, 8)
    front, back = bio_split(bio, 4)
    back_front, back_back = bio_split(back, 2)
    bio_endio(front)
    bio_endio(back_front)
    assert not bio.done.is_set()
    bio_endio(back_back)
    assert bio.done.is_set()
    bio.wait(0)


def test_child_error_reaches_parent():
    bio = write_bio(0, 8)
    front, back = bio_split(bio, 4)
    bio_endio(front, TargetIOError("boom"))
    bio_endio(back)
    with pytest.raises(TargetIOError):
        bio.wait(0)


def test_split_outside_the_bio_is_refused():
    with pytest.raises(InvalidInput):
        bio_split(write_bio(0, 8), 8)


def test_wait_times_out():
    with pytest.raises(TimeoutError):
        write_bio(0, 1).wait(0.001)
