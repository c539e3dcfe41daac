"""What the crypt target hands its engine, seen through a scripted ``MockEngine``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from typing_extensions import Buffer

from app.blk.bio import Bio
from app.blk.limits import QueueLimits
from app.blk.request import Request
from app.dm.table import parse_table
from app.dm.targets import CryptTarget, MapContext, MapResult
from app.dm.targets.base import finished
from app.dm.volume import Volume
from app.engine.base import EngineRequest, EngineResult
from app.engine.mock import MockEngine
from app.errors import ReqcryptError
from app.io.ops import Io
from app.storage.memory import MemoryStore
from app.vocab import Op, Wait
from tests.support.keys import XTS_KEY
from tests.support.volumes import make_volume

# A crypt target that starts at sector 8, over the device from sector 0.
TABLE = f"0 8 zero\n8 2040 crypt aes-xts-plain64 {XTS_KEY} 0 pv 0"
CONTEXT = MapContext("request")


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


def test_a_write_that_may_overwrite_is_encrypted_in_its_own_buffer(
    volume: Volume, engine: MockEngine, store: MemoryStore
) -> None:
    buffer = bytearray(b"x" * 4096)
    write = Io.write(16 * 512, memoryview(buffer), may_overwrite=True)
    volume.submit_batch([write])
    assert write.error is None
    (request,) = engine.requests
    assert request.into is request.segments
    assert bytes(buffer) != b"x" * 4096
    assert read_device(store, 8 * 512, 4096) == bytes(buffer)
    assert volume.read(16 * 512, 4096) == b"x" * 4096


def test_a_request_merging_a_buffer_that_must_not_change_leaves_every_buffer_alone(
    volume: Volume, engine: MockEngine
) -> None:
    owned, lent = bytearray(b"o" * 4096), bytearray(b"l" * 4096)
    writes = [
        Io.write(16 * 512, memoryview(owned), may_overwrite=True),
        Io.write(24 * 512, memoryview(lent)),
    ]
    volume.submit_batch(writes)
    (request,) = engine.requests
    assert request.bios == [(8, 8), (16, 8)]
    assert (bytes(owned), bytes(lent)) == (b"o" * 4096, b"l" * 4096)
    assert volume.read(16 * 512, 8192) == b"o" * 4096 + b"l" * 4096


def test_a_partial_write_is_encrypted_in_place_in_the_data_paths_own_buffer(
    volume: Volume, engine: MockEngine
) -> None:
    data = bytearray(b"p" * 1000)
    volume.write(16 * 512 + 100, data)
    encrypt = engine.requests[-1]
    assert encrypt.op == "encrypt"
    assert encrypt.into is encrypt.segments  # the read-modify-write's own buffer
    assert data == b"p" * 1000
    assert volume.read(16 * 512 + 100, 1000) == b"p" * 1000


def test_write_zeroes_are_encrypted_in_place_in_zeros_of_the_targets_own(
    volume: Volume, engine: MockEngine, store: MemoryStore
) -> None:
    volume.write(16 * 512, b"x" * 8192)
    volume.write_zeroes(16 * 512, 8192)
    encrypt = engine.requests[-1]
    assert (encrypt.op, encrypt.sector) == ("encrypt", 8)
    assert encrypt.into is encrypt.segments
    assert read_device(store, 8 * 512, 8192) == bytes(encrypt.segments[0]) != bytes(8192)
    assert volume.read(16 * 512, 8192) == bytes(8192)


def test_a_failed_write_that_may_overwrite_writes_nothing(store: MemoryStore) -> None:
    def fail(request: EngineRequest) -> EngineResult:
        raise EngineFailed("engine fault")

    volume = open_volume(store, MockEngine(fail))
    write = Io.write(8 * 512, memoryview(bytearray(b"z" * 4096)), may_overwrite=True)
    try:
        volume.submit_batch([write])
    finally:
        volume.remove()
    assert isinstance(write.error, EngineFailed)
    assert read_device(store, 0, 4096) == bytes(4096)


def test_the_halves_of_a_split_write_that_may_overwrite_are_encrypted_in_place() -> None:
    store = MemoryStore(2048 * 512)
    volume = make_volume(store, limits=QueueLimits(max_sectors_kb=4))
    buffer = bytearray(b"s" * 16384)
    try:
        write = Io.write(0, memoryview(buffer), may_overwrite=True)
        volume.submit_batch([write])
        assert write.error is None
        assert volume.stats.snapshot()["w_ios"] == 4
        assert volume.read(0, 16384) == b"s" * 16384
    finally:
        volume.remove()
    assert bytes(buffer) == read_device(store, 0, 16384) != b"s" * 16384


@pytest.mark.parametrize(
    "spec",
    [
        f"aes-xts-plain64 {XTS_KEY}",
        f"aes-xts-plain64 {XTS_KEY} 0 pv 0 1 sector_size:4096",
        f"aes-cbc-essiv:sha256 {XTS_KEY[:64]}",
        f"aes-cbc-plain64 {XTS_KEY[:64]}",
        f"aes-cbc-lmk {XTS_KEY[:64]}",
        f"aes-cbc-tcw {XTS_KEY}",
        f"aes-ctr-plain64 {XTS_KEY[:64]}",
        f"aes-ecb {XTS_KEY[:64]}",
        f"camellia-xts-plain64 {XTS_KEY}",
    ],
)
@pytest.mark.parametrize("dispatch_mode", ["bio", "request"])
def test_encrypting_in_place_writes_the_ciphertext_of_a_copy(
    spec: str, dispatch_mode: str, aes_path: str
) -> None:
    """Every transform and engine call plan, on every AES path this CPU runs, may be handed
    the same buffer as input and output: a bio's payload may alias its ciphertext."""
    cipher, key, *rest = spec.split()
    tail = " ".join(rest) if rest else "0 pv 0"
    table = f"0 2048 crypt {cipher} {key} {tail}"
    payload = bytes(range(256)) * 96  # 24 KiB: whole 4096-byte units, several per call
    devices = []
    for may_overwrite in (False, True):
        store = MemoryStore(2048 * 512)
        volume = make_volume(store, table, dispatch_mode=dispatch_mode)
        try:
            write = Io.write(4096, memoryview(bytearray(payload)), may_overwrite=may_overwrite)
            volume.submit_batch([write])
            assert write.error is None
            assert volume.read(4096, len(payload)) == payload
        finally:
            volume.remove()
        devices.append(read_device(store, 4096, len(payload)))
    copied, in_place = devices
    assert in_place == copied != payload


@pytest.mark.parametrize("dispatch_mode", ["bio", "request"])
def test_write_zeroes_leave_the_ciphertext_of_written_zeros(dispatch_mode: str) -> None:
    devices = []
    for zero in (True, False):
        store = MemoryStore(2048 * 512)
        volume = make_volume(store, dispatch_mode=dispatch_mode)
        try:
            if zero:
                volume.write_zeroes(4096, 24576)
            else:
                volume.write(4096, bytes(24576))
        finally:
            volume.remove()
        devices.append(read_device(store, 4096, 24576))
    zeroed, written = devices
    assert zeroed == written != bytes(24576)


class DeferredStore(MemoryStore):
    """A store whose reads and writes land only when their wait runs, as on a network."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.waits: list[str] = []

    def submit_readv(self, offset: int, buffers: Sequence[memoryview]) -> Wait:
        def wait() -> None:
            self.waits.append("read")
            self.readv_into(offset, buffers)

        return wait

    def submit_writev(self, offset: int, buffers: Sequence[Buffer]) -> Wait:
        data = b"".join(bytes(buffer) for buffer in buffers)

        def wait() -> None:
            self.waits.append("write")
            self.write(offset, data)

        return wait


def crypt_target(volume: Volume) -> CryptTarget:
    assert volume.live is not None
    target = volume.live.targets[1]
    assert isinstance(target, CryptTarget)
    return target


def request(op: Op, sector: int, data: bytes, *, fua: bool = False) -> Request:
    bio = Bio(op, sector, len(data) // 512, [memoryview(bytearray(data))], fua=fua)
    return Request.from_bio(bio, 1 << 20)


@pytest.mark.parametrize("fua", [False, True])
def test_a_write_the_device_answers_at_once_is_done_when_submitted(
    volume: Volume, store: MemoryStore, engine: MockEngine, fua: bool
) -> None:
    started = crypt_target(volume).submit(request(Op.WRITE, 8, b"w" * 4096, fua=fua), CONTEXT)
    assert started == MapResult(8, 0)  # the mock's profile: one call per unit, no time
    assert store.flushes == (1 if fua else 0)
    assert len(engine.requests) == 1


def test_a_read_the_device_answers_at_once_is_decrypted_when_submitted(
    volume: Volume, engine: MockEngine
) -> None:
    volume.write(8 * 512, b"r" * 4096)
    rq = request(Op.READ, 8, bytes(4096))
    assert isinstance(crypt_target(volume).submit(rq, CONTEXT), MapResult)
    assert bytes(rq.segments[0]) == b"r" * 4096
    assert [r.op for r in engine.requests] == ["encrypt", "decrypt"]


def test_a_read_the_device_answers_later_is_decrypted_once_it_lands(engine: MockEngine) -> None:
    store = DeferredStore(2048 * 512)
    volume = open_volume(store, engine)
    try:
        volume.write(8 * 512, b"d" * 4096)
        target = crypt_target(volume)
        rq = request(Op.READ, 8, bytes(4096))
        engine.requests.clear()
        started = target.submit(rq, CONTEXT)
        assert not isinstance(started, MapResult)
        assert engine.requests == []
        assert store.waits == ["write"]
        assert finished(started) == MapResult(8, 0)
        assert store.waits == ["write", "read"]
        assert bytes(rq.segments[0]) == b"d" * 4096
    finally:
        volume.remove()


def test_a_fua_write_the_device_answers_later_is_flushed_after_its_wait(
    engine: MockEngine,
) -> None:
    store = DeferredStore(2048 * 512)
    volume = open_volume(store, engine)
    try:
        started = crypt_target(volume).submit(request(Op.WRITE, 8, b"f" * 4096, fua=True), CONTEXT)
        assert not isinstance(started, MapResult)
        assert (store.waits, store.flushes) == ([], 0)
        assert finished(started) == MapResult(8, 0)
        assert (store.waits, store.flushes) == (["write"], 1)
    finally:
        volume.remove()
