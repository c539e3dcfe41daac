"""Workload plans: offsets per rw mode, seeded randomness, sizes."""

from __future__ import annotations

import pytest

from app.bench.workload import Workload, job_ios
from app.errors import InvalidInput
from app.sizes import format_size, parse_size


def offsets(workload: Workload, job: int = 0) -> list[int]:
    return [io.offset for io in job_ios(workload, job)]


def test_sequential_read_walks_the_region_in_order() -> None:
    workload = Workload(rw="read", bs=4096, size=16384, offset=8192)
    assert offsets(workload) == [8192, 12288, 16384, 20480]
    assert {io.op for io in job_ios(workload, 0)} == {"read"}


def test_each_job_owns_its_own_region() -> None:
    workload = Workload(rw="write", bs=4096, size=8192, numjobs=3)
    assert offsets(workload, 2) == [16384, 20480]
    assert {io.op for io in job_ios(workload, 1)} == {"write"}
    assert workload.span == 24576
    assert workload.total_bytes == 24576


def test_random_modes_visit_every_block_once() -> None:
    workload = Workload(rw="randwrite", bs=512, size=512 * 64, seed=7)
    got = offsets(workload)
    assert sorted(got) == [512 * block for block in range(64)]
    assert got != sorted(got)


def test_the_same_seed_gives_the_same_offsets_and_another_seed_does_not() -> None:
    first = Workload(rw="randread", bs=4096, size=4096 * 32, seed=1)
    assert offsets(first) == offsets(Workload(rw="randread", bs=4096, size=4096 * 32, seed=1))
    assert offsets(first) != offsets(Workload(rw="randread", bs=4096, size=4096 * 32, seed=2))
    assert offsets(first, 0) != offsets(first, 1)


def test_randrw_mixes_reads_and_writes_by_rwmixread() -> None:
    workload = Workload(rw="randrw", bs=512, size=512 * 2000, rwmixread=70, seed=3)
    ops = [io.op for io in job_ios(workload, 0)]
    share = ops.count("read") / len(ops)
    assert 0.65 < share < 0.75
    assert ops == [io.op for io in job_ios(workload, 0)]


@pytest.mark.parametrize(("rwmixread", "expected"), [(100, {"read"}), (0, {"write"})])
def test_rwmixread_extremes(rwmixread: int, expected: set[str]) -> None:
    workload = Workload(rw="readwrite", bs=512, size=512 * 50, rwmixread=rwmixread)
    assert {io.op for io in job_ios(workload, 0)} == expected


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4k", 4096),
        ("512KiB", 512 << 10),
        ("1M", 1 << 20),
        ("2g", 2 << 30),
        ("512", 512),
        ("1.5G", 3 << 29),
    ],
)
def test_parse_size_reads_fio_sizes(text: str, value: int) -> None:
    assert parse_size(text) == value


def test_parse_size_refuses_a_fraction_of_a_byte() -> None:
    with pytest.raises(InvalidInput, match="whole number of bytes"):
        parse_size("1.3k")


def test_format_size_is_the_short_form() -> None:
    assert [format_size(v) for v in (4096, 512 << 10, 1 << 20, 1000)] == [
        "4k",
        "512k",
        "1M",
        "1000",
    ]


@pytest.mark.parametrize(
    "fields",
    [{"bs": 1000}, {"size": 100}, {"iodepth": 0}, {"rwmixread": 101}, {"rw": "trim"}],
)
def test_invalid_workloads_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(InvalidInput):
        Workload.from_dict(fields)


def test_from_dict_refuses_unknown_fields() -> None:
    with pytest.raises(InvalidInput, match="unknown field"):
        Workload.from_dict({"blocksize": "4k"})
