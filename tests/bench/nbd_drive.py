"""An NBD connection driven in process: 4 KiB random I/O at queue depth 32, no sockets.

fio's nbd engine as the connection sees it: a burst of requests lands in the receive
buffer, each reply lets one more in. The transport is a stub that counts replies, so
what a run costs is the server's request path (parsing, the batch, the queue, the crypt
target, the engine, the file store, the replies), not the network. The cyclic collector
runs as ``reqcrypt serve`` runs it (``settle_collector``): with CPython's default young
generation it would collect about once per batch. For instruction counts per I/O:

    export PYTHONHASHSEED=0 OPENBLAS_NUM_THREADS=1
    valgrind --tool=callgrind python -m tests.bench.nbd_drive write 1000
    valgrind --tool=callgrind python -m tests.bench.nbd_drive write 5000

and divide the difference of the totals by 4000. The two variables make start-up repeat
(string hashes, OpenBLAS's thread pool); the driver cannot set them itself: they act
before it runs, and a re-executed child would escape callgrind.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import uvloop

from app.blk.tuning import Tuning
from app.cli import settle_collector
from app.dm.table import parse_table
from app.dm.volume import Volume
from app.engine.registry import EngineRegistry
from app.io.admission import VolumeAdmission
from app.io.executor import IoExecutor
from app.nbd import protocol
from app.nbd.server import ExportStats, NbdConnection
from app.storage.file import FileStore
from tests.support.keys import XTS_KEY

SIZE = 64 << 20
BLOCK = 4096
QUEUE_DEPTH = 32
PLUG_WINDOW_US = 50
"""The service default."""


class Transport:
    """Counts the replies of each ``writelines`` and hands the count to ``replied``."""

    def __init__(self, replied: Any, parts_per_reply: int) -> None:
        self.replied = replied
        self.parts_per_reply = parts_per_reply

    def writelines(self, parts: list[bytes | memoryview]) -> None:
        self.replied(len(parts) // self.parts_per_reply)

    def write(self, data: bytes) -> None:
        raise AssertionError(f"an error reply: {data!r}")

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def close(self) -> None: ...


def request_stream(op: str, count: int) -> memoryview:
    """Every request the client sends (a write with its payload), back to back: built at
    once with numpy, so that a run's cost per I/O is the server's, not the client's."""
    header = np.dtype(
        [
            ("magic", ">u4"),
            ("flags", ">u2"),
            ("command", ">u2"),
            ("handle", ">u8"),
            ("offset", ">u8"),
            ("length", ">u4"),
        ]
    )
    assert header.itemsize == protocol.REQUEST.size
    write = op == "write"
    with_payload = np.dtype([("header", header), ("payload", np.uint8, BLOCK)])
    stream = np.zeros(count, with_payload if write else header)
    headers = stream["header"] if write else stream
    headers["magic"] = protocol.REQUEST_MAGIC
    headers["command"] = protocol.Command.WRITE if write else protocol.Command.READ
    headers["handle"] = np.arange(count)
    headers["offset"] = np.random.default_rng(1).integers(SIZE // BLOCK, size=count) * BLOCK
    headers["length"] = BLOCK
    if write:
        stream["payload"] = np.frombuffer(os.urandom(BLOCK), np.uint8)
    return memoryview(stream.tobytes())


def drive(op: str, count: int, directory: Path) -> None:
    """``count`` random 4 KiB ``op``s ("read" or "write") through one NBD connection."""
    store = FileStore(directory / "pv", SIZE, create=True)
    volume = Volume(
        "v",
        "uuid-v",
        engine=EngineRegistry().engine("software"),
        tuning=Tuning(plug_window_us=PLUG_WINDOW_US),
        suspend_wait_seconds=0.2,
    )
    volume.load(parse_table(f"0 {SIZE // 512} crypt aes-xts-plain64 {XTS_KEY} 0 pv 0"))
    volume.resume(lambda ref: store)
    executor = IoExecutor()
    server = SimpleNamespace(
        admission=VolumeAdmission(1024),
        executor=executor,
        max_in_flight=256,
        max_in_flight_bytes=64 << 20,
        connections=set(),
    )
    stream = request_stream(op, count)
    request_size = len(stream) // count

    async def run() -> None:
        loop = asyncio.get_running_loop()
        finished = loop.create_future()
        connection = NbdConnection(server)  # type: ignore[arg-type]
        sent = done = 0

        def send(requests: int) -> None:
            nonlocal sent
            data = stream[sent * request_size : (sent + requests) * request_size]
            sent += requests
            connection.get_buffer(len(data))[: len(data)] = data
            loop.call_soon(connection.buffer_updated, len(data))

        def replied(replies: int) -> None:
            nonlocal done
            done += replies
            if more := min(replies, count - sent):
                send(more)
            if done >= count and not finished.done():
                finished.set_result(None)

        # A read's structured reply is a chunk header and the data.
        parts_per_reply = 2 if op == "read" else 1
        connection.transport = Transport(replied, parts_per_reply)  # type: ignore[assignment]
        connection.volume = volume
        connection.name = "v"
        connection.export = protocol.Export("v", SIZE, 0, 1, BLOCK, 1 << 20)
        connection.stats = ExportStats()
        connection.structured = True  # as libnbd negotiates
        connection.transmission = True
        send(min(QUEUE_DEPTH, count))
        await finished

    settle_collector()
    try:
        uvloop.run(run())
    finally:
        executor.shutdown()
        volume.remove()
        store.close()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as temporary:
        drive(sys.argv[1], int(sys.argv[2]), Path(temporary))
