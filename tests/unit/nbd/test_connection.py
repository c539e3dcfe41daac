"""An NBD connection driven in process through a stub transport: what becomes of a write's
payload, of the requests still waiting in the receive buffer behind it, and of a request
cut between reads while other connections read into the receive area they share."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from app.io.admission import VolumeAdmission
from app.io.budget import ByteBudget
from app.io.executor import IoExecutor
from app.io.ops import Io
from app.nbd import protocol, server
from app.nbd.protocol import Command, CommandFlag, Errno, RequestHeader
from app.nbd.server import (
    DIRECT_PAYLOAD,
    HANDSHAKE_RECEIVE,
    RECEIVE_SIZE,
    ExportStats,
    NbdConnection,
)
from app.storage.memory import MemoryStore
from tests.support.volumes import SECTORS, make_volume

SIZE = SECTORS * 512
BLOCK = 4096
EXPORT = protocol.Export("v", SIZE, 0, 1, BLOCK, 1 << 20)


class Transport:
    """Collects what the connection sends."""

    def __init__(self) -> None:
        self.sent = bytearray()

    def writelines(self, parts: list[bytes | memoryview]) -> None:
        for part in parts:
            self.sent += part

    def write(self, data: bytes) -> None:
        self.sent += data

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def close(self) -> None: ...


def request(
    command: int, handle: int, offset: int, length: int, payload: bytes = b"", flags: int = 0
) -> bytes:
    return protocol.pack_request(RequestHeader(flags, command, handle, offset, length)) + payload


def stub_server(executor: IoExecutor, max_in_flight: int) -> Any:
    """What a connection uses of its ``NbdServer``."""
    receive = memoryview(bytearray(RECEIVE_SIZE))
    return SimpleNamespace(
        admission=VolumeAdmission(1024),
        budget=ByteBudget(1 << 30),
        executor=executor,
        max_in_flight=max_in_flight,
        max_in_flight_bytes=64 << 20,
        send_timeout=30.0,
        connections=set(),
        receive=receive,
        receive_handshake=receive[:HANDSHAKE_RECEIVE],
        stats_of=lambda volume: ExportStats(),
    )


def transmitting(context: Any, volume: Any, export: protocol.Export) -> tuple[Any, Transport]:
    """A connection of ``context`` past negotiation, on a stub transport."""
    connection = NbdConnection(context)
    transport = Transport()
    connection.transport = transport  # type: ignore[assignment]
    connection._enter_transmission(volume, export)
    return connection, transport


async def feed(connection: NbdConnection, piece: bytes) -> None:
    """``piece`` as socket reads, each as much as ``get_buffer`` takes at a time."""
    position = 0
    while position < len(piece):
        area = connection.get_buffer(len(piece) - position)
        taken = min(len(area), len(piece) - position)
        area[:taken] = piece[position : position + taken]
        position += taken
        connection.buffer_updated(taken)
        await asyncio.sleep(0)


def serve(
    volume: Any, pieces: list[bytes], max_in_flight: int, export: protocol.Export = EXPORT
) -> dict[int, tuple[int, bytes]]:
    """Feed ``pieces`` to one connection, each as one socket read (as much as
    ``get_buffer`` takes at a time), and return each handle's (error, read data). Every
    read's budget is back once all are answered."""
    executor = IoExecutor()
    context = stub_server(executor, max_in_flight)
    stream = b"".join(pieces)
    lengths = {}
    position = 0
    while position < len(stream):
        header = protocol.parse_request(stream, position)
        lengths[header.handle] = header.length if header.command == Command.READ else 0
        carries = header.command == Command.WRITE
        position += protocol.REQUEST.size + (header.length if carries else 0)

    async def run() -> bytes:
        connection, transport = transmitting(context, volume, export)
        for piece in pieces:
            await feed(connection, piece)
        for _ in range(2000):
            if connection.stats.batches and connection.in_flight == 0 and not connection.buffer:
                break
            await asyncio.sleep(0.001)
        return bytes(transport.sent)

    try:
        sent = asyncio.run(run())
    finally:
        executor.shutdown()
    assert context.budget.held == 0
    answers = {}
    position = 0
    while position < len(sent):
        magic, error, handle = protocol.SIMPLE_REPLY.unpack_from(sent, position)
        assert magic == protocol.SIMPLE_REPLY_MAGIC
        position += protocol.SIMPLE_REPLY.size
        length = lengths[handle] if error == 0 else 0
        answers[handle] = (error, sent[position : position + length])
        position += length
    assert answers.keys() == lengths.keys()
    return answers


def device(store: MemoryStore) -> bytes:
    buffer = bytearray(SIZE)
    store.read_into(0, memoryview(buffer))
    return bytes(buffer)


@pytest.fixture
def submitted(monkeypatch: pytest.MonkeyPatch) -> list[Io]:
    """Every ``Io`` the connection hands the I/O layer."""
    ios: list[Io] = []
    submit = server.submit

    def recording(executor: IoExecutor, volume: Any, batch: list[Io], *, inline: bool) -> Any:
        ios.extend(batch)
        return submit(executor, volume, batch, inline=inline)

    monkeypatch.setattr(server, "submit", recording)
    return ios


def test_writes_are_encrypted_in_their_payloads_into_the_ciphertext_of_a_copy(
    submitted: list[Io],
) -> None:
    """Payloads the connection owns are encrypted where they lie, while requests behind
    them wait in the receive buffer (the in-flight bound holds them there): the device ends
    as writes of copies leave it, every request is answered, and reads see the plaintext."""
    big = bytes(range(256)) * (DIRECT_PAYLOAD // 256)  # received into its own buffer
    writes = [
        (0, big),
        *[(offset * BLOCK, bytes([offset]) * BLOCK) for offset in (20, 21, 22, 40)],
        (30 * BLOCK, b"a" * 2 * BLOCK),
        (31 * BLOCK, b"b" * BLOCK),  # over the second block of the write before it
        (50 * BLOCK + 100, b"c" * 1000),  # partial blocks: read-modify-written
    ]
    first = request(Command.WRITE, 1, 0, len(big), big)
    burst = b"".join(
        request(Command.WRITE, handle, offset, len(data), data, CommandFlag.FUA * (handle == 5))
        for handle, (offset, data) in enumerate(writes[1:], start=2)
    )
    burst += request(Command.WRITE_ZEROES, 9, 21 * BLOCK, BLOCK)
    pieces = [first[:5000], first[5000:], burst[:6000], burst[6000:]]
    store = MemoryStore(SIZE)
    volume = make_volume(store)
    try:
        answers = serve(volume, pieces, max_in_flight=3)
        assert {handle: error for handle, (error, _) in answers.items()} == dict.fromkeys(
            range(1, 10), 0
        )
        reads = [(handle, *write) for handle, write in enumerate(writes, start=10)]
        answers = serve(
            volume,
            [b"".join(request(Command.READ, h, offset, len(data)) for h, offset, data in reads)],
            max_in_flight=64,
        )
    finally:
        volume.remove()
    expected = dict(writes)
    expected[21 * BLOCK] = bytes(BLOCK)
    expected[30 * BLOCK] = b"a" * BLOCK + b"b" * BLOCK
    assert {h: answers[h][1] for h, offset, _ in reads} == {
        h: expected.get(offset, data) for h, offset, data in reads
    }

    reference_store = MemoryStore(SIZE)
    reference = make_volume(reference_store)
    try:
        for offset, data in writes:
            reference.write(offset, data)
        reference.write_zeroes(21 * BLOCK, BLOCK)
    finally:
        reference.remove()
    ciphertext = device(store)
    assert ciphertext == device(reference_store)

    whole = [io for io in submitted if io.op == "write" and io.length % BLOCK == 0]
    assert len(whole) == 7
    for io in whole:
        assert io.buffer is not None
        if io.offset not in (21 * BLOCK, 30 * BLOCK):  # not written over afterwards
            assert bytes(io.buffer) == ciphertext[io.offset : io.offset + io.length]
        assert bytes(io.buffer) != dict(writes)[io.offset]


@pytest.mark.parametrize("read_only", [False, True])
def test_each_request_gets_the_error_check_request_gives_it(read_only: bool) -> None:
    """Reads and writes of the shape the connection accepts inline, and the others it hands
    to ``check_request``: each answer is the error that function gives on the export."""
    flags = protocol.transmission_flags(read_only=read_only, trim=False)
    export = protocol.Export("v", SIZE, flags, 1, BLOCK, 1 << 20)
    shapes = [
        (Command.READ, 0, BLOCK, 0),
        (Command.READ, SIZE - BLOCK, BLOCK, 0),
        (Command.READ, SIZE - BLOCK, 2 * BLOCK, 0),
        (Command.READ, 0, BLOCK, 1 << 15),
        (Command.WRITE, BLOCK, BLOCK, 0),
        (Command.WRITE, SIZE - BLOCK, BLOCK, CommandFlag.FUA),
        (Command.WRITE, SIZE, BLOCK, 0),
        (Command.WRITE, 0, BLOCK, CommandFlag.NO_HOLE),
        (Command.TRIM, 0, BLOCK, 0),
    ]
    headers = [
        RequestHeader(int(flags), int(command), handle, offset, length)
        for handle, (command, offset, length, flags) in enumerate(shapes, start=1)
    ]
    expected = {header.handle: protocol.check_request(header, export)[0] for header in headers}
    assert {0, Errno.EINVAL, Errno.EPERM if read_only else Errno.ENOSPC} <= set(expected.values())
    stream = b"".join(
        protocol.pack_request(header)
        + (bytes(header.length) if header.command == Command.WRITE else b"")
        for header in headers
    )
    volume = make_volume(MemoryStore(SIZE))
    try:
        answers = serve(volume, [stream], max_in_flight=64, export=export)
    finally:
        volume.remove()
    assert {handle: error for handle, (error, _) in answers.items()} == expected


@pytest.mark.parametrize("split", [20, 1000, DIRECT_PAYLOAD // 2], ids=["header", "small", "big"])
def test_requests_split_across_reads_survive_other_connections_reading_into_the_same_area(
    split: int,
) -> None:
    """Connections share one receive area: each keeps what it has of a request that a read
    cut (a header, a small payload, a direct payload) before the next connection's read
    lands where it lay."""
    executor = IoExecutor()
    context = stub_server(executor, 64)
    size = max(2 * split, BLOCK)
    writes = {offset: bytes([offset // size + 1]) * size for offset in (0, size, 2 * size)}
    streams = {
        offset: request(Command.WRITE, 1, offset, size, data)
        + request(Command.READ, 2, offset, size)
        for offset, data in writes.items()
    }
    volume = make_volume(MemoryStore(SIZE))

    async def run() -> list[bytes]:
        connections = [transmitting(context, volume, EXPORT) for _ in streams]
        for half in (slice(None, split), slice(split, None)):
            for (connection, _), stream in zip(connections, streams.values(), strict=True):
                await feed(connection, stream[half])
        for _ in range(2000):
            if all(c.stats.batches and c.in_flight == 0 for c, _ in connections):
                break
            await asyncio.sleep(0.001)
        return [bytes(transport.sent) for _, transport in connections]

    try:
        sent = asyncio.run(run())
        stored = {offset: volume.read(offset, size) for offset in writes}
    finally:
        executor.shutdown()
        volume.remove()
    assert stored == writes
    for replies, data in zip(sent, writes.values(), strict=True):
        assert replies.endswith(data)  # the read's payload, after its reply header
    assert context.budget.held == 0
