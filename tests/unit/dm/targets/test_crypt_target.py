"""What the crypt target hands its engine, seen through a scripted ``MockEngine``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from typing_extensions import Buffer

from app.dm.table import parse_table
from app.dm.volume import Volume
from app.engine.base import EngineRequest, EngineResult
from app.engine.mock import MockEngine
from app.errors import ReqcryptError
from app.storage.memory import MemoryStore
from tests.support.keys import XTS_KEY

# A crypt target that starts at sector 8, over the device from sector 0.
TABLE = f"0 8 zero\n8 2040 crypt aes-xts-plain64 {XTS_KEY} 0 pv 0"


class EngineFailed(ReqcryptError):
    pass


def open_volume(store: MemoryStore, engine: MockEngine) -> Volume:
    volume = Volume("v", "uuid-1", engine=engine, suspend_wait_seconds=0.2)
    volume.load(parse_table(TABLE))
    volume.resume(lambda ref: store)
    return volume


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore(2048 * 512)


@pytest.fixture
def engine() -> MockEngine:
    return MockEngine()


@pytest.fixture
def volume(store: MemoryStore, engine: MockEngine) -> Iterator[Volume]:
    opened = open_volume(store, engine)
    yield opened
    opened.remove()


def test_a_write_is_encrypted_at_target_relative_sectors(
    volume: Volume, engine: MockEngine
) -> None:
    volume.write(16 * 512, b"x" * 4096)
    (request,) = engine.requests
    assert (request.op, request.sector, request.dispatch_mode) == ("encrypt", 8, "request")
    assert request.bios == [(8, 8)]
    # The ciphertext goes to the target's own buffer: the writer's plaintext is left alone.
    assert request.into is not None
    assert [len(out) for out in request.into] == [len(s) for s in request.segments]
    assert bytes(request.segments[0]) == b"x" * 4096


def test_a_read_decrypts_into_the_bios_pages(volume: Volume, engine: MockEngine) -> None:
    volume.write(16 * 512, b"y" * 4096)
    assert volume.read(16 * 512, 4096) == b"y" * 4096
    request = engine.requests[-1]
    assert (request.op, request.sector) == ("decrypt", 8)
    assert request.into is not None
    assert [len(out) for out in request.into] == [len(s) for s in request.segments]


def read_device(store: MemoryStore, offset: int, length: int) -> bytes:
    buffer = bytearray(length)
    store.read_into(offset, memoryview(buffer))
    return bytes(buffer)


def test_the_device_holds_what_the_engine_returned(store: MemoryStore) -> None:
    def mark(request: EngineRequest) -> EngineResult:
        converted = engine.convert(request)
        marked: list[Buffer] = [b"\xee" * len(bytes(out)) for out in converted.outputs]
        return EngineResult(marked, converted.plan, modelled_ns=0)

    engine = MockEngine(mark)
    volume = open_volume(store, engine)
    try:
        volume.write(8 * 512, b"a" * 4096)
    finally:
        volume.remove()
    assert read_device(store, 0, 4096) == b"\xee" * 4096


def test_the_volume_counts_the_calls_the_engine_reports(volume: Volume) -> None:
    volume.write(8 * 512, bytes(4096))
    assert volume.stats.snapshot()["engine_calls"] == 8  # the mock's profile: one call per unit


def test_an_engine_failure_fails_the_write_and_writes_nothing(store: MemoryStore) -> None:
    def fail(request: EngineRequest) -> EngineResult:
        raise EngineFailed("engine fault")

    volume = open_volume(store, MockEngine(fail))
    try:
        with pytest.raises(EngineFailed):
            volume.write(8 * 512, b"z" * 4096)
    finally:
        volume.remove()
    assert read_device(store, 0, 4096) == bytes(4096)
