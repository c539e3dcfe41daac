"""``Volume.submit_batch`` of any alignment: one submission, bios merged under one plug, each
I/O independent, the partial-block rule applied."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from app.dm.volume import Volume
from app.io.ops import Io
from app.storage.memory import MemoryStore
from app.vocab import Op
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
    writes = [Io.write(i * 4096, memoryview(b)) for i, b in enumerate(blocks)]
    volume.submit_batch(writes)
    after = volume.stats.snapshot()
    assert [io.error for io in writes] == [None] * 64
    assert after["w_ios"] - before["w_ios"] <= 2
    assert after["w_bios"] - before["w_bios"] == 64
    assert volume.read(0, 64 * 4096) == b"".join(blocks)


def test_a_batch_read_fills_every_buffer_in_one_submission(volume: Volume) -> None:
    data = os.urandom(64 * 1024)
    volume.write(0, data)
    wanted = [(4096 * i, 4096) for i in range(0, 16, 2)] + [(100, 7), (65000, 500)]
    reads = [Io.read(offset, memoryview(bytearray(length))) for offset, length in wanted]
    volume.submit_batch(reads)
    assert [io.error for io in reads] == [None] * len(wanted)
    assert [bytes(io.buffer or b"") for io in reads] == [data[o : o + n] for o, n in wanted]


def test_overlapping_writes_apply_in_batch_order(volume: Volume) -> None:
    first, second, third = b"A" * 8192, b"B" * 4096, b"C" * 10
    writes = [Io.write(0, memoryview(first)), Io.write(4096, memoryview(second))]
    writes.append(Io.write(4100, memoryview(third)))
    volume.submit_batch(writes)
    assert [io.error for io in writes] == [None, None, None]
    assert volume.read(0, 8192) == b"A" * 4096 + b"BBBB" + b"C" * 10 + b"B" * 4082


def test_unaligned_writes_in_a_batch_keep_their_neighbours(volume: Volume) -> None:
    volume.write(0, b"\xee" * 8192)
    writes = [Io.write(10, memoryview(b"x" * 5)), Io.write(5000, memoryview(b"y" * 3))]
    volume.submit_batch(writes)
    assert [io.error for io in writes] == [None, None]
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
        writes = [
            Io.write(0, memoryview(b"1" * 4096)),
            Io.write(half * 512, memoryview(b"2" * 4096)),
        ]
        volume.submit_batch(writes)
        assert writes[0].error is None
        assert writes[1].error is not None
        assert volume.read(0, 4096) == b"1" * 4096
    finally:
        volume.remove()


def test_the_generation_moves_once_per_batch(volume: Volume) -> None:
    generation = volume.generation
    volume.submit_batch(
        [Io.write(0, memoryview(b"a" * 512)), Io.write(1024, memoryview(b"b" * 512))]
    )
    assert volume.generation == generation + 1


@pytest.fixture
def rule_volume() -> Iterator[Volume]:
    """4 KiB logical blocks, discards allowed: partial blocks are easy to place."""
    table = f"0 {SECTORS} crypt aes-xts-plain64 {XTS_KEY} 0 pv 0 2 allow_discards sector_size:4096"
    vol = make_volume(MemoryStore(SIZE), table)
    yield vol
    vol.remove()


def test_write_zeroes_read_modify_writes_its_partial_edge_blocks(rule_volume: Volume) -> None:
    rule_volume.write(0, b"\xee" * 16384)
    zeroes = Io(Op.WRITE_ZEROES, 1000, 10000)
    rule_volume.submit_batch([zeroes])
    assert zeroes.error is None
    assert rule_volume.read(0, 16384) == b"\xee" * 1000 + bytes(10000) + b"\xee" * 5384


def test_a_discard_is_rounded_inward_and_keeps_its_partial_edge_blocks(rule_volume: Volume) -> None:
    rule_volume.write(0, b"\xee" * 16384)
    discard = Io(Op.DISCARD, 1000, 12000)  # whole only over blocks 1 and 2
    rule_volume.submit_batch([discard])
    assert discard.error is None
    after = rule_volume.read(0, 16384)
    assert after[:4096] == b"\xee" * 4096
    assert after[12288:] == b"\xee" * 4096
    assert rule_volume.stats.snapshot()["d_sectors"] == 16


def test_a_discard_within_one_block_discards_nothing(rule_volume: Volume) -> None:
    rule_volume.write(0, b"\xee" * 4096)
    rule_volume.submit_batch([Io(Op.DISCARD, 100, 3000)])
    assert rule_volume.read(0, 4096) == b"\xee" * 4096
    assert rule_volume.stats.snapshot()["d_ios"] == 0


def test_a_flush_in_a_batch_follows_the_writes_before_it(volume: Volume) -> None:
    ios = [Io.write(0, memoryview(b"a" * 4096)), Io(Op.FLUSH, 0, 0)]
    ios.append(Io.write(4096, memoryview(b"b" * 4096)))
    volume.submit_batch(ios)
    assert [io.error for io in ios] == [None, None, None]
    stats = volume.stats.snapshot()
    assert (stats["w_ios"], stats["f_ios"]) == (2, 1)  # the flush split the run


def test_reads_and_flushes_leave_the_version_alone(volume: Volume) -> None:
    generation = volume.generation
    volume.submit_batch([Io.read(0, memoryview(bytearray(512))), Io(Op.FLUSH, 0, 0)])
    assert volume.generation == generation
