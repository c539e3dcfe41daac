"""Batched I/O on a volume: one submission, bios merged under one plug, each write independent."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from app.dm.volume import Volume
from app.errors import RangeNotSatisfiable
from app.storage.memory import MemoryStore
from tests.support.keys import XTS_KEY
from tests.support.volumes import SECTORS, make_volume

SIZE = SECTORS * 512


@pytest.fixture
def volume() -> Iterator[Volume]:
    vol = make_volume(MemoryStore(SIZE), f"0 {SECTORS} crypt aes-xts-plain64 {XTS_KEY} 0 pv 0")
    yield vol
    vol.remove()


def test_sequential_writes_of_a_batch_become_one_request(volume: Volume) -> None:
    blocks = [os.urandom(4096) for _ in range(64)]
    before = volume.stats.snapshot()
    errors, _ = volume.write_batch([(i * 4096, memoryview(b)) for i, b in enumerate(blocks)])
    after = volume.stats.snapshot()
    assert errors == [None] * 64
    assert after["w_ios"] - before["w_ios"] <= 2
    assert after["w_bios"] - before["w_bios"] == 64
    assert volume.read(0, 64 * 4096) == b"".join(blocks)


def test_a_batch_read_fills_every_buffer_in_one_submission(volume: Volume) -> None:
    data = os.urandom(64 * 1024)
    volume.write(0, data)
    wanted = [(4096 * i, 4096) for i in range(0, 16, 2)] + [(100, 7), (65000, 500)]
    buffers = [(offset, memoryview(bytearray(length))) for offset, length in wanted]
    volume.read_batch(buffers)
    assert [bytes(b) for _, b in buffers] == [data[o : o + n] for o, n in wanted]


def test_overlapping_writes_apply_in_batch_order(volume: Volume) -> None:
    first, second, third = b"A" * 8192, b"B" * 4096, b"C" * 10
    errors, _ = volume.write_batch(
        [(0, memoryview(first)), (4096, memoryview(second)), (4100, memoryview(third))]
    )
    assert errors == [None, None, None]
    assert volume.read(0, 8192) == b"A" * 4096 + b"BBBB" + b"C" * 10 + b"B" * 4082


def test_unaligned_writes_in_a_batch_keep_their_neighbours(volume: Volume) -> None:
    volume.write(0, b"\xee" * 8192)
    errors, _ = volume.write_batch([(10, memoryview(b"x" * 5)), (5000, memoryview(b"y" * 3))])
    assert errors == [None, None]
    expected = bytearray(b"\xee" * 8192)
    expected[10:15] = b"x" * 5
    expected[5000:5003] = b"y" * 3
    assert volume.read(0, 8192) == expected


def test_a_failing_part_does_not_fail_the_others() -> None:
    store = MemoryStore(SIZE)
    half = SECTORS // 2
    volume = make_volume(
        store, f"0 {half} crypt aes-xts-plain64 {XTS_KEY} 0 pv 0\n{half} {half} error"
    )
    try:
        errors, _ = volume.write_batch(
            [(0, memoryview(b"1" * 4096)), (half * 512, memoryview(b"2" * 4096))]
        )
        assert errors[0] is None
        assert errors[1] is not None
        assert volume.read(0, 4096) == b"1" * 4096
    finally:
        volume.remove()


def test_a_batch_reaching_beyond_the_volume_writes_nothing(volume: Volume) -> None:
    before = volume.read(0, 4096)
    with pytest.raises(RangeNotSatisfiable):
        volume.write_batch([(0, memoryview(b"z" * 4096)), (SIZE - 1, memoryview(b"zz"))])
    assert volume.read(0, 4096) == before


def test_the_generation_moves_once_per_batch(volume: Volume) -> None:
    generation = volume.generation
    volume.write_batch([(0, memoryview(b"a" * 512)), (1024, memoryview(b"b" * 512))])
    assert volume.generation == generation + 1
