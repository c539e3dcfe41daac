"""The volume data path and lifecycle in memory: atomic edges, suspend, drain, flush."""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterator, Sequence

import pytest

from app.dm.table import DeviceRef, parse_table
from app.dm.volume import Volume
from app.engine.registry import EngineRegistry
from app.errors import InvalidState, KeyNotSet, LeaseExpired, Unavailable
from app.storage.memory import MemoryStore
from tests.support.keys import XTS_KEY
from tests.support.volumes import SECTORS, make_volume


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore(SECTORS * 512)


@pytest.fixture
def volume(store: MemoryStore) -> Iterator[Volume]:
    vol = make_volume(store)
    yield vol
    vol.remove()


def test_concurrent_partial_writes_to_one_unit_never_lose_each_other(volume: Volume) -> None:
    """Read-modify-write of a shared data unit is atomic: disjoint byte ranges both survive."""
    rounds = 200
    errors: list[BaseException] = []

    def writer(offset: int, tag: int) -> None:
        try:
            for i in range(rounds):
                volume.write(offset, bytes([tag ^ (i & 0x0F)]) * 100)
        except BaseException as exc:  # pragma: no cover - surfaced below
            errors.append(exc)

    threads = [
        threading.Thread(target=writer, args=(off, tag))
        for off, tag in ((0, 0xA0), (200, 0xB0), (400, 0xC0))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    unit = volume.read(0, 512)
    last = (rounds - 1) & 0x0F
    assert unit[0:100] == bytes([0xA0 ^ last]) * 100
    assert unit[200:300] == bytes([0xB0 ^ last]) * 100
    assert unit[400:500] == bytes([0xC0 ^ last]) * 100


def test_unaligned_write_inside_a_4096_byte_data_unit_keeps_the_rest(store: MemoryStore) -> None:
    volume = make_volume(
        store, f"0 {SECTORS} crypt aes-xts-plain64 {XTS_KEY} 0 pv 0 1 sector_size:4096"
    )
    volume.write(0, b"a" * 8192)
    volume.write(4000, b"b" * 200)
    assert volume.read(0, 8192) == b"a" * 4000 + b"b" * 200 + b"a" * 3992
    volume.remove()


def test_suspended_volume_holds_io_until_the_bound_then_is_unavailable(volume: Volume) -> None:
    volume.suspend()
    with pytest.raises(Unavailable, match="suspended"):
        volume.read(0, 512)


def test_io_held_by_suspend_proceeds_after_resume(volume: Volume, store: MemoryStore) -> None:
    volume.suspend_wait_seconds = 5
    volume.suspend()
    result: list[bytes] = []
    reader = threading.Thread(target=lambda: result.append(bytes(volume.read(0, 512))))
    reader.start()
    time.sleep(0.05)
    assert result == []
    volume.resume(lambda ref: store)
    reader.join(5)
    assert len(result) == 1


def test_suspend_drains_in_flight_io_first(volume: Volume) -> None:
    started = threading.Event()
    release = threading.Event()
    original = volume.live.targets[0].submit  # type: ignore[union-attr]

    def slow_submit(request, context):  # type: ignore[no-untyped-def]
        started.set()
        release.wait(5)
        return original(request, context)

    volume.live.targets[0].submit = slow_submit  # type: ignore[method-assign,union-attr]
    writer = threading.Thread(target=volume.write, args=(0, b"x" * 512))
    writer.start()
    started.wait(5)
    assert volume.in_flight == 1
    suspended = threading.Event()
    suspender = threading.Thread(target=lambda: (volume.suspend(), suspended.set()))
    suspender.start()
    time.sleep(0.05)
    assert not suspended.is_set()
    release.set()
    suspender.join(5)
    writer.join(5)
    assert suspended.is_set()
    assert volume.in_flight == 0


def test_flush_reaches_the_backing_store(volume: Volume, store: MemoryStore) -> None:
    volume.write(0, b"d" * 512)
    volume.flush()
    assert store.flushes >= 1


def test_fua_write_is_flushed(volume: Volume, store: MemoryStore) -> None:
    volume.write(0, b"d" * 512, fua=True)
    assert store.flushes >= 1


def test_key_messages_are_refused_while_active(volume: Volume) -> None:
    with pytest.raises(InvalidState):
        volume.plan_message(["key", "wipe"])


def test_resume_with_a_wiped_key_is_refused(volume: Volume, store: MemoryStore) -> None:
    volume.suspend()
    index, table = volume.plan_message(["key", "wipe"])
    volume.apply_line(index, table, lambda ref: store)
    with pytest.raises(KeyNotSet, match="crypt key is not set"):
        volume.resume(lambda ref: store)


def test_request_mode_merges_concurrent_sequential_writers(store: MemoryStore) -> None:
    volume = make_volume(store, plug_window_us=2000)
    barrier = threading.Barrier(8)

    def writer(index: int) -> None:
        barrier.wait()
        volume.write(index * 4096, bytes([index]) * 4096)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = volume.stats.snapshot()
    assert stats["w_bios"] == 8
    assert stats["w_ios"] < 8
    assert stats["w_merges"] >= 1
    for i in range(8):
        assert volume.read(i * 4096, 4096) == bytes([i]) * 4096
    volume.remove()


def test_bio_mode_never_merges(store: MemoryStore) -> None:
    volume = make_volume(store, dispatch_mode="bio", plug_window_us=2000)
    threads = [
        threading.Thread(target=volume.write, args=(i * 4096, bytes(4096))) for i in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = volume.stats.snapshot()
    assert stats["w_ios"] == 8
    assert stats["w_merges"] == 0
    volume.remove()


def test_device_ref_is_resolved_per_line(store: MemoryStore) -> None:
    seen: list[DeviceRef] = []
    volume = Volume("v", "u", engine=EngineRegistry().engine("software"))
    volume.load(parse_table("0 1024 linear pv 0\n1024 1024 linear /dev/pv 1024"))
    volume.resume(lambda ref: seen.append(ref) or store)  # type: ignore[func-returns-value]
    assert [ref.name for ref in seen] == ["pv", "pv"]
    volume.remove()


def test_crypt_stacked_on_two_crypt_targets_reads_back_across_their_boundary(
    store: MemoryStore,
) -> None:
    half = SECTORS // 2
    lower = make_volume(
        store,
        f"0 {half} crypt aes-xts-plain64 {XTS_KEY} 0 pv 0\n"
        f"{half} {half} crypt aes-cbc-essiv:sha256 {XTS_KEY[:64]} 0 pv {half}",
    )
    upper = Volume("upper", "u2", engine=EngineRegistry().engine("software"))
    upper_key = bytes(range(64, 128)).hex()
    upper.load(parse_table(f"0 {SECTORS} crypt aes-xts-plain64 {upper_key} 0 /dev/mapper/v 0"))
    upper.resume(lambda ref: lower)
    data = os.urandom(64 * 1024)
    offset = half * 512 - 32 * 1024
    upper.write(offset, data)
    for _ in range(2):  # the second read reuses the thread's ciphertext buffers
        assert upper.read(offset, len(data)) == data
    assert lower.read(offset, len(data)) != data
    upper.remove()
    lower.remove()


def test_stacked_volume_over_4096_byte_units_reads_and_writes_through(store: MemoryStore) -> None:
    lower = make_volume(
        store, f"0 {SECTORS} crypt aes-xts-plain64 {XTS_KEY} 0 pv 0 1 sector_size:4096"
    )
    upper = Volume("upper", "u2", engine=EngineRegistry().engine("software"))
    upper.load(parse_table(f"0 {SECTORS} linear /dev/mapper/v 0"))
    upper.resume(lambda ref: lower)
    upper.write(512, b"q" * 1024)
    assert upper.read(0, 2048) == bytes(lower.read(0, 512)) + b"q" * 1024 + bytes(
        lower.read(1536, 512)
    )
    assert lower.read(512, 1024) == b"q" * 1024
    upper.remove()
    lower.remove()


class SlowReadStore(MemoryStore):
    """Reads take a while, so a read-modify-write is still in the target during a resume."""

    def read_into(self, offset: int, buffer: memoryview) -> None:
        time.sleep(0.002)
        super().read_into(offset, buffer)

    def readv_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        time.sleep(0.002)
        super().readv_into(offset, buffers)


def test_resume_with_a_new_table_drains_in_flight_writes_first() -> None:
    """A table swap on an active volume is an implicit suspend: no write in flight sees
    the old targets wiped under it (dmsetup resume drains before it swaps)."""
    store = SlowReadStore(SECTORS * 512)
    volume = make_volume(store)
    table = parse_table(f"0 {SECTORS} crypt aes-xts-plain64 {XTS_KEY} 0 pv 0")
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer(offset: int) -> None:
        while not stop.is_set():
            try:
                volume.write(offset, os.urandom(700))
            except BaseException as exc:
                errors.append(exc)
                return

    threads = [threading.Thread(target=writer, args=(100 + 4096 * i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(20):
            volume.load(table)
            volume.resume(lambda ref: store)
            time.sleep(0.003)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        volume.remove()
    assert errors == []


def test_io_past_the_lease_deadline_is_refused_and_writes_nothing(volume: Volume) -> None:
    volume.write(0, b"a" * 4096)
    volume.hold_lease_until(time.monotonic() - 1)
    with pytest.raises(LeaseExpired):
        volume.write(0, b"b" * 4096)
    with pytest.raises(LeaseExpired):
        volume.read(0, 4096)
    volume.hold_lease_until(math.inf)
    assert volume.read(0, 4096) == b"a" * 4096


def test_a_lost_lease_wakes_io_waiting_on_a_suspended_volume(volume: Volume) -> None:
    volume.suspend_wait_seconds = 30
    volume.suspend()
    failures: list[BaseException] = []

    def writer() -> None:
        try:
            volume.write(0, b"c" * 4096)
        except BaseException as error:
            failures.append(error)

    thread = threading.Thread(target=writer)
    thread.start()
    time.sleep(0.2)
    volume.hold_lease_until(-math.inf)
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert [type(error) for error in failures] == [LeaseExpired]
