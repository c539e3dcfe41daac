"""dm-crypt's queue model: each flag takes the kernel's path, and only there."""

from __future__ import annotations

import dataclasses

import pytest

from app.engine.kcryptd import (
    BIO_MAX_BYTES,
    DEFAULT_MAX_SIZE,
    Completion,
    Platform,
    QueueFlags,
    crypt_path,
    io_time,
    mixed_rate,
)
from app.errors import InvalidInput

BRD = Platform(
    name="test",
    cpus=4,
    io_ns={"read": 2000.0, "write": 2000.0},
    hop_ns=5000.0,
    encrypt_bytes_per_s=1e9,
    decrypt_bytes_per_s=2e9,
    device_bytes_per_s=8e9,
)


def hops(op: str, platform: Platform = BRD, **flags: bool) -> tuple[str, ...]:
    return crypt_path(op, QueueFlags(**flags), platform.completion).hops  # type: ignore[arg-type]


def test_stock_read_hands_the_decryption_to_kcryptd_and_wakes_the_submitter() -> None:
    assert hops("read") == ("kcryptd", "wake submitter")


def test_stock_write_goes_through_kcryptd_and_the_write_thread() -> None:
    assert hops("write") == ("kcryptd", "dmcrypt_write", "wake submitter")


def test_no_workqueue_flags_take_every_hop_off_their_own_direction_only() -> None:
    assert hops("read", no_read_workqueue=True) == ()
    assert hops("write", no_read_workqueue=True) == hops("write")
    assert hops("write", no_write_workqueue=True) == ()
    assert hops("read", no_write_workqueue=True) == hops("read")


def test_submit_from_crypt_cpus_skips_the_write_thread_and_leaves_reads_alone() -> None:
    assert hops("write", submit_from_crypt_cpus=True) == ("kcryptd", "wake submitter")
    assert hops("read", submit_from_crypt_cpus=True) == hops("read")


def test_same_cpu_crypt_binds_kcryptd_without_removing_a_hop() -> None:
    for op in ("read", "write"):
        bound = hops(op, same_cpu_crypt=True)
        assert len(bound) == len(hops(op))
        assert bound[0] == "kcryptd (bound)"


def test_a_device_completing_in_irq_already_wakes_the_submitter() -> None:
    irq = dataclasses.replace(BRD, completion=Completion(endio_in_irq=True))
    assert hops("read", irq) == ("kcryptd",)


def test_no_read_workqueue_from_hard_irq_falls_back_to_kcryptd_from_6_8() -> None:
    tasklet = dataclasses.replace(BRD, completion=Completion(endio_in_irq=True, kernel=(6, 7)))
    workqueue = dataclasses.replace(BRD, completion=Completion(endio_in_irq=True, kernel=(6, 8)))
    assert hops("read", tasklet, no_read_workqueue=True) == ()
    assert hops("read", workqueue, no_read_workqueue=True) == ("kcryptd (from hard IRQ)",)


def test_an_async_driver_in_irq_context_defers_to_cryptd() -> None:
    async_irq = dataclasses.replace(
        BRD, completion=Completion(endio_in_irq=True, async_driver=True, kernel=(5, 9))
    )
    assert hops("read", async_irq, no_read_workqueue=True) == ("cryptd (SIMD unusable in IRQ)",)


def test_io_time_is_device_plus_cipher_plus_hops() -> None:
    time = io_time(BRD, QueueFlags(), "write", 4096)
    assert time.device_ns == 2000.0
    assert time.crypt_ns == pytest.approx(4096.0)  # 1 GB/s
    assert time.hops_ns == 3 * 5000.0
    assert time.total_ns == pytest.approx(2000 + 4096 + 15000)


def test_unencrypted_io_is_the_raw_device() -> None:
    assert io_time(BRD, QueueFlags(), "read", 4096, encrypted=False).total_ns == 2000.0


def test_per_unit_cost_is_charged_per_data_unit() -> None:
    costly = dataclasses.replace(BRD, unit_ns=100.0, encrypt_bytes_per_s=None)
    assert io_time(costly, QueueFlags(no_write_workqueue=True), "write", 4096).crypt_ns == 800.0


def test_before_6_11_reads_are_never_split_and_writes_at_one_mib() -> None:
    flags = QueueFlags()
    assert io_time(BRD, flags, "read", 4 * BIO_MAX_BYTES).pieces == 1
    assert io_time(BRD, flags, "write", 4 * BIO_MAX_BYTES).pieces == 4


def test_6_11_split_spreads_pieces_over_the_cpus_of_an_unbound_kcryptd() -> None:
    split = QueueFlags(max_read_size=DEFAULT_MAX_SIZE, max_write_size=DEFAULT_MAX_SIZE)
    one_mib = 1 << 20
    whole = io_time(BRD, QueueFlags(), "read", one_mib)
    spread = io_time(BRD, split, "read", one_mib)
    assert spread.pieces == 8
    assert spread.crypt_ns == pytest.approx(whole.crypt_ns / 4)  # 8 pieces over 4 CPUs
    assert io_time(BRD, split, "read", one_mib, cpus=8).crypt_ns == pytest.approx(
        whole.crypt_ns / 8
    )


@pytest.mark.parametrize(
    "flags",
    [
        QueueFlags(same_cpu_crypt=True, max_read_size=DEFAULT_MAX_SIZE),
        QueueFlags(no_read_workqueue=True, max_read_size=DEFAULT_MAX_SIZE),
    ],
    ids=["same_cpu_crypt", "inline"],
)
def test_split_pieces_crypted_on_one_cpu_take_as_long_as_the_whole(flags: QueueFlags) -> None:
    one_mib = 1 << 20
    assert io_time(BRD, flags, "read", one_mib).crypt_ns == pytest.approx(
        io_time(BRD, QueueFlags(), "read", one_mib).crypt_ns
    )


def test_writes_stay_capped_at_bio_max_whatever_max_write_size_says() -> None:
    assert QueueFlags(max_write_size=4 << 20).split_bytes("write") == BIO_MAX_BYTES


def test_a_split_needs_a_stated_cpu_count() -> None:
    unknown = dataclasses.replace(BRD, cpus=None)
    with pytest.raises(InvalidInput, match="CPU count"):
        io_time(unknown, QueueFlags(max_read_size=DEFAULT_MAX_SIZE), "read", 1 << 20)


def test_split_sizes_must_be_whole_pages() -> None:
    with pytest.raises(InvalidInput, match="multiple of 4096"):
        QueueFlags(max_read_size=6000)


def test_a_mixed_job_moves_one_block_each_way_per_read_and_write_pair() -> None:
    pair = (
        io_time(BRD, QueueFlags(), "read").total_ns + io_time(BRD, QueueFlags(), "write").total_ns
    )
    assert mixed_rate(BRD, QueueFlags()) == pytest.approx(4096 * 1e9 / pair)
