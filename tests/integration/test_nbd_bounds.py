"""What hostile or slow NBD clients can make the server hold (issue #44), in process.

Connections past REQCRYPT_NBD_MAX_CONNECTIONS are closed before their greeting while the
open ones are served; a connection costs a few KiB until it negotiates; an option flood
whose replies are never read stops being read at a small high-water mark; a client that
leaves its replies unread is aborted after REQCRYPT_SEND_TIMEOUT_SECONDS; read replies
are counted in the process-wide budget, waited for when it is spent, and all of it comes
back when the connections go.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import cast

import httpx
import pytest
from fastapi import FastAPI

from app.config import Settings
from app.io.budget import ByteBudget
from app.nbd import protocol
from app.nbd.protocol import Command, Option
from app.nbd.server import HANDSHAKE_RECEIVE, HANDSHAKE_WRITE_HIGH, NbdServer
from tests.support.app import make_settings
from tests.support.factories import make_device, make_volume, xts_table
from tests.support.nbd_client import Answer, RawClient

pytestmark = pytest.mark.anyio
MIB = 1 << 20
MAX_CONNECTIONS = 32
SEND_TIMEOUT = 0.5
BUDGET = 8 * MIB


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {"use_uvloop": False}), id="asyncio"),
        pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),  # what serve runs
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, bool]]:
    """Both loops: uvloop sends at the end of a loop pass, asyncio at once."""
    backend: tuple[str, dict[str, bool]] = request.param
    return backend


@pytest.fixture
def settings(data_dir: Path) -> Settings:
    return make_settings(
        data_dir,
        nbd_port=0,
        nbd_max_connections=MAX_CONNECTIONS,
        send_timeout_seconds=SEND_TIMEOUT,
        max_buffered_bytes=BUDGET,
    )


@pytest.fixture
def nbd(app: FastAPI) -> NbdServer:
    server: NbdServer = app.state.reqcrypt.nbd
    return server


@pytest.fixture
def budget(app: FastAPI) -> ByteBudget:
    held: ByteBudget = app.state.reqcrypt.budget
    return held


@pytest.fixture
async def exported(client: httpx.AsyncClient) -> str:
    await make_device(client, "pv", 4 * MIB)
    await make_volume(client, "vol", xts_table("pv", 8192), nbd_export=True)
    return "vol"


async def until(condition: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def raw_socket(port: int, receive_buffer: int | None = None) -> socket.socket:
    """A connected socket that reads nothing unless told (no stream reading behind it)."""
    sock = socket.socket()
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return sock


async def test_connections_past_the_cap_are_closed_before_the_greeting_while_open_ones_work(
    nbd: NbdServer, exported: str, caplog: pytest.LogCaptureFixture
) -> None:
    working = await RawClient.open(nbd.port, exported)
    idle = [await raw_socket(nbd.port) for _ in range(MAX_CONNECTIONS - 1)]
    await until(lambda: len(nbd.connections) == MAX_CONNECTIONS)
    with caplog.at_level(logging.WARNING, logger="reqcrypt.nbd"):
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", nbd.port)
            assert await asyncio.wait_for(reader.read(18), 2) == b""  # no greeting: closed
            writer.close()
    assert nbd.refused == 3
    assert len([r for r in caplog.records if "refused" in r.getMessage()]) == 1
    data = bytes(range(256)) * 16
    assert (await working.request(Command.WRITE, 0, len(data), payload=data)).error == 0
    assert (await working.request(Command.READ, 0, len(data))).data == data
    idle.pop().close()
    await until(lambda: len(nbd.connections) == MAX_CONNECTIONS - 1)
    late = await RawClient.open(nbd.port, exported)  # a freed place is taken again
    assert (await late.request(Command.READ, 0, len(data))).data == data
    for sock in idle:
        sock.close()
    await late.close()
    await working.close()


async def test_a_connection_costs_a_few_kib_until_it_negotiates(nbd: NbdServer) -> None:
    """Sockets that connect and say nothing: what the server allocates for each (its
    objects, the transport, the negotiation task; no receive buffer of its own)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        idle = [await raw_socket(nbd.port) for _ in range(MAX_CONNECTIONS)]
        await until(lambda: len(nbd.connections) == MAX_CONNECTIONS)
        await asyncio.sleep(0.1)  # every negotiation has sent its greeting and waits
        each = (tracemalloc.get_traced_memory()[0] - before) / MAX_CONNECTIONS
    finally:
        tracemalloc.stop()
    for sock in idle:
        sock.close()
    assert each < 16 << 10, f"{each / 1024:.1f} KiB a connection"


async def test_an_option_flood_whose_replies_are_never_read_stays_bounded_and_is_dropped(
    nbd: NbdServer, exported: str
) -> None:
    loop = asyncio.get_running_loop()
    sock = await raw_socket(nbd.port, receive_buffer=4096)
    await loop.sock_sendall(sock, struct.pack(">I", 3))
    await until(lambda: len(nbd.connections) == 1)
    (connection,) = nbd.connections
    flood = struct.pack(">QII", protocol.IHAVEOPT, Option.LIST, 0) * (512 << 10)  # 8 MiB
    sending = loop.create_task(loop.sock_sendall(sock, flood))
    replies = kept = 0
    started = time.monotonic()
    while nbd.connections:
        assert connection.transport is not None
        replies = max(replies, connection.transport.get_write_buffer_size())
        kept = max(kept, len(connection.buffer))
        await asyncio.sleep(0.005)
        assert time.monotonic() - started < SEND_TIMEOUT + 2, "not dropped"
    sending.cancel()
    sock.close()
    # Without the bound: megabytes of LIST replies queued (8 MiB before reading paused).
    assert replies <= HANDSHAKE_WRITE_HIGH + 1024
    assert kept <= 2 * HANDSHAKE_RECEIVE + protocol.MAX_OPTION_LENGTH
    assert nbd.send_timeouts == 1


async def test_a_client_that_never_reads_its_read_replies_is_aborted_and_its_budget_returns(
    nbd: NbdServer, exported: str, budget: ByteBudget
) -> None:
    raw = await RawClient.open(nbd.port, exported)
    cast(asyncio.Transport, raw.writer.transport).pause_reading()  # takes no reply from here
    for _ in range(40):
        raw.send(Command.READ, 0, MIB)
    await until(lambda: budget.held >= 4 * MIB)  # replies waiting for it hold the budget
    assert budget.held <= BUDGET
    await until(lambda: not nbd.connections, SEND_TIMEOUT + 2)
    await until(lambda: budget.held == 0)
    assert nbd.send_timeouts == 1
    other = await RawClient.open(nbd.port, exported)
    assert (await other.request(Command.READ, 0, MIB)).error == 0
    await until(lambda: budget.held == 0)
    await other.close()
    raw.writer.close()


async def test_reads_wait_for_a_spent_budget_and_go_on_once_it_is_given_back(
    nbd: NbdServer, exported: str, budget: ByteBudget
) -> None:
    hog = budget.take(BUDGET, "a test's hold")  # what other clients' buffers might hold
    raw = await RawClient.open(nbd.port, exported)
    handle = raw.send(Command.READ, 0, 4096)
    pending = asyncio.ensure_future(raw.answer())
    await asyncio.sleep(0.2)
    assert not pending.done()  # waiting, not refused: a block client cannot retry
    budget.give(hog)
    answer = await asyncio.wait_for(pending, 2)
    assert (answer.handle, answer.error, len(answer.data)) == (handle, 0, 4096)
    await until(lambda: budget.held == 0)
    await raw.close()


async def test_clients_reading_more_than_the_whole_budget_at_once_all_get_their_replies(
    nbd: NbdServer, exported: str, budget: ByteBudget
) -> None:
    """Each pipelines twice the budget in reads: they take turns, none waits holding
    budget it cannot give back, and all of it is back at the end."""
    clients = [await RawClient.open(nbd.port, exported) for _ in range(3)]

    async def read_twice_the_budget(client: RawClient) -> list[Answer]:
        for i in range(16):
            client.send(Command.READ, (i % 4) * MIB, MIB)
        return [await client.answer() for _ in range(16)]

    everyone = asyncio.gather(*(read_twice_the_budget(client) for client in clients))
    for answers in await asyncio.wait_for(everyone, 10):
        assert all(a.error == 0 and len(a.data) == MIB for a in answers)
    assert budget.peak <= BUDGET
    await until(lambda: budget.held == 0)
    for client in clients:
        await client.close()
