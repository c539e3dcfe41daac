"""The NBD server in process, spoken to byte by byte: handshake, errors, batching, lifecycle."""

from __future__ import annotations

import asyncio
import socket
import struct
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from app.config import Settings
from app.dm.volume import Volume
from app.main import create_app
from app.nbd import protocol
from app.nbd.protocol import Command, CommandFlag, Errno, Option, Reply, RequestHeader
from app.nbd.server import OVERLAPPED_JOBS
from tests.support.app import ADMIN_TOKEN, IO_TOKEN, asgi_client, make_settings
from tests.support.factories import make_device, make_volume, xts_table
from tests.support.nbd_client import RawClient

pytestmark = pytest.mark.anyio
MIB = 1 << 20


@pytest.fixture
def settings(data_dir: Path) -> Settings:
    return make_settings(data_dir, suspend_wait_seconds=1.0, nbd_port=0)


@pytest.fixture
def port(app: FastAPI) -> int:
    server = app.state.reqcrypt.nbd
    assert server is not None
    port: int = server.port
    return port


@pytest.fixture
async def exported(client: httpx.AsyncClient) -> str:
    await make_device(client, "pv", 4 * MIB)
    await make_volume(client, "vol", xts_table("pv", 8192), nbd_export=True)
    return "vol"


async def test_server_is_off_without_a_port(data_dir: Path) -> None:
    application = create_app(Settings(data_dir=data_dir, admin_token=ADMIN_TOKEN))  # type: ignore[arg-type]
    async with application.router.lifespan_context(application):
        assert application.state.reqcrypt.nbd is None


async def test_unknown_option_is_unsupported_and_haggling_goes_on(port: int, exported: str) -> None:
    client = await RawClient.connect(port)
    (reply,) = await client.option(99, b"abc")
    assert reply.reply == Reply.ERR_UNSUP
    (reply,) = await client.option(Option.STRUCTURED_REPLY)
    assert reply.reply == Reply.ACK
    replies = await client.option(Option.GO, client.info_data(exported))
    assert replies[-1].reply == Reply.ACK
    await client.close()


async def test_list_names_only_exported_volumes(
    port: int, exported: str, client: httpx.AsyncClient
) -> None:
    await make_device(client, "pv2", MIB)
    await make_volume(client, "private", xts_table("pv2", 2048))
    raw = await RawClient.connect(port)
    replies = await raw.option(Option.LIST)
    assert [r.reply for r in replies] == [Reply.SERVER, Reply.ACK]
    assert replies[0].data == struct.pack(">I", 3) + b"vol"
    (invalid,) = await raw.option(Option.LIST, b"x")
    assert invalid.reply == Reply.ERR_INVALID
    await raw.close()


async def test_info_on_an_unexported_or_missing_volume_is_unknown(
    port: int, exported: str, client: httpx.AsyncClient
) -> None:
    await make_device(client, "pv2", MIB)
    await make_volume(client, "private", xts_table("pv2", 2048))
    raw = await RawClient.connect(port)
    for name in ("private", "missing"):
        (reply,) = await raw.option(Option.INFO, raw.info_data(name))
        assert reply.reply == Reply.ERR_UNKNOWN
    replies = await raw.option(Option.INFO, raw.info_data(exported, 1))
    assert [r.reply for r in replies] == [Reply.INFO] * 3 + [Reply.ACK]
    assert replies[2].data == b"\x00\x01vol"
    (reply,) = await raw.option(Option.GO, b"\x00\x00\x00\x09vol")
    assert reply.reply == Reply.ERR_INVALID
    await raw.close()


async def test_export_name_on_a_missing_export_closes_the_session(port: int, exported: str) -> None:
    raw = await RawClient.connect(port)
    raw.send_option(Option.EXPORT_NAME, b"missing")
    assert await raw.closed_by_server()


async def test_export_name_enters_transmission_with_size_and_flags(
    port: int, exported: str
) -> None:
    raw = await RawClient.connect(port, client_flags=1)
    raw.send_option(Option.EXPORT_NAME, exported.encode())
    size, flags = struct.unpack(">QH", await raw.reader.readexactly(10))
    assert await raw.reader.readexactly(124) == bytes(124)
    assert size == 4 * MIB
    assert flags == protocol.transmission_flags(read_only=False, trim=False)
    answer = await raw.request(Command.READ, 0, 512)
    assert answer.error == 0
    assert len(answer.data) == 512
    await raw.close()


async def test_abort_is_acknowledged_then_closed(port: int) -> None:
    raw = await RawClient.connect(port)
    (reply,) = await raw.option(Option.ABORT)
    assert reply.reply == Reply.ACK
    assert await raw.closed_by_server()


async def test_starttls_without_tls_configured_is_refused_by_policy(port: int) -> None:
    raw = await RawClient.connect(port)
    (reply,) = await raw.option(Option.STARTTLS)
    assert reply.reply == Reply.ERR_POLICY
    await raw.close()


async def test_unknown_client_flags_drop_the_connection(port: int) -> None:
    raw = await RawClient.connect(port, client_flags=1 | 8)
    assert await raw.closed_by_server()


async def test_writes_read_back_with_structured_replies(port: int, exported: str) -> None:
    raw = await RawClient.open(port, exported)
    data = bytes(range(256)) * 40
    assert (await raw.request(Command.WRITE, 1000, len(data), payload=data)).error == 0
    answer = await raw.request(Command.READ, 1000, len(data))
    assert answer.data == data
    await raw.close()


async def test_big_writes_received_in_pieces_read_back_and_the_stream_goes_on(
    port: int, exported: str
) -> None:
    raw = await RawClient.open(port, exported)
    first, second = bytes(range(256)) * 1024, bytes(range(255, -1, -1)) * 1024
    header = protocol.pack_request(RequestHeader(0, Command.WRITE, 100, 0, len(first)))
    stream = (
        header
        + first
        + protocol.pack_request(RequestHeader(0, Command.WRITE, 101, 512 * 1024, len(second)))
    )
    for start in range(0, len(stream), 50_000):  # headers and payloads split across reads
        raw.writer.write(stream[start : start + 50_000])
        await raw.writer.drain()
        await asyncio.sleep(0.001)
    raw.writer.write(second)
    answers = [await raw.answer() for _ in range(2)]
    assert sorted((a.handle, a.error) for a in answers) == [(100, 0), (101, 0)]
    assert (await raw.request(Command.READ, 0, len(first))).data == first
    assert (await raw.request(Command.READ, 512 * 1024, len(second))).data == second
    await raw.close()


async def test_a_big_write_past_the_end_is_enospc_after_its_payload(
    port: int, exported: str
) -> None:
    raw = await RawClient.open(port, exported)
    write = await raw.request(Command.WRITE, 4 * MIB - 4096, 256 * 1024, payload=bytes(256 * 1024))
    assert write.error == Errno.ENOSPC
    assert (await raw.request(Command.READ, 0, 512)).error == 0
    await raw.close()


async def test_simple_replies_when_structured_replies_are_not_negotiated(
    port: int, exported: str
) -> None:
    raw = await RawClient.open(port, exported, structured=False)
    assert (await raw.request(Command.WRITE, 0, 4, payload=b"abcd")).error == 0
    assert (await raw.request(Command.READ, 0, 4)).data == b"abcd"
    beyond = await raw.request(Command.READ, 4 * MIB, 512)
    assert beyond.error == Errno.EINVAL
    assert beyond.data == b""
    assert (await raw.request(Command.READ, 0, 4)).data == b"abcd"
    await raw.close()


async def test_requests_past_the_end_are_einval_or_enospc(port: int, exported: str) -> None:
    raw = await RawClient.open(port, exported)
    read = await raw.request(Command.READ, 4 * MIB - 512, 1024)
    assert read.error == Errno.EINVAL
    assert "past the end" in read.message
    write = await raw.request(Command.WRITE, 4 * MIB, 512, payload=bytes(512))
    assert write.error == Errno.ENOSPC
    zeroes = await raw.request(Command.WRITE_ZEROES, 4 * MIB, 512)
    assert zeroes.error == Errno.EINVAL
    assert (await raw.request(Command.READ, 4 * MIB - 512, 512)).error == 0
    await raw.close()


async def test_unknown_commands_and_flags_are_einval(port: int, exported: str) -> None:
    raw = await RawClient.open(port, exported)
    assert (await raw.request(42, 0, 512)).error == Errno.EINVAL
    assert (await raw.request(Command.READ, 0, 512, flags=1 << 3)).error == Errno.EINVAL
    trim = await raw.request(Command.TRIM, 0, 512)
    assert trim.error == Errno.EINVAL
    assert "allow_discards" in trim.message
    await raw.close()


async def test_oversized_requests_are_einval_and_the_connection_goes_on(
    port: int, exported: str
) -> None:
    raw = await RawClient.open(port, exported)
    too_big = protocol.MAX_PAYLOAD + 512
    assert (await raw.request(Command.READ, 0, too_big)).error == Errno.EINVAL
    handle = raw.send(Command.WRITE, 0, too_big, payload=b"\xee" * too_big)
    answer = await raw.answer()
    assert (answer.handle, answer.error) == (handle, Errno.EINVAL)
    read = await raw.request(Command.READ, 0, 512)
    assert read.error == 0
    assert read.data != b"\xee" * 512
    await raw.close()


async def test_a_protocol_violation_drops_only_that_connection(port: int, exported: str) -> None:
    good = await RawClient.open(port, exported)
    bad = await RawClient.open(port, exported)
    bad.writer.write(b"\x00" * 28)
    assert await bad.closed_by_server()
    assert (await good.request(Command.READ, 0, 512)).error == 0
    await good.close()


async def test_pipelined_requests_are_answered_by_handle_in_one_batch_and_merged(
    port: int, exported: str, app: FastAPI, client: httpx.AsyncClient
) -> None:
    raw = await RawClient.open(port, exported)
    handles = {
        raw.send(Command.WRITE, i * 4096, 4096, payload=bytes([i]) * 4096) for i in range(32)
    }
    answers = [await raw.answer() for _ in range(32)]
    assert {a.handle for a in answers} == handles
    assert all(a.error == 0 for a in answers)
    status = (await client.get("/v1/volumes/vol/status")).json()
    assert status["stats"]["w_bios"] == 32
    assert status["stats"]["w_ios"] < 32  # merged in the shared plug
    assert status["nbd"]["requests"]["write"] == 32
    assert status["nbd"]["batches"] <= 4
    read = await raw.request(Command.READ, 0, 32 * 4096)
    assert read.data == b"".join(bytes([i]) * 4096 for i in range(32))
    await raw.close()


async def test_write_zeroes_unaligned_and_fua(port: int, exported: str) -> None:
    raw = await RawClient.open(port, exported)
    assert (await raw.request(Command.WRITE, 0, 8192, payload=b"\xff" * 8192)).error == 0
    zeroes = await raw.request(
        Command.WRITE_ZEROES, 100, 5000, flags=CommandFlag.FUA | CommandFlag.NO_HOLE
    )
    assert zeroes.error == 0
    read = await raw.request(Command.READ, 0, 8192)
    assert read.data == b"\xff" * 100 + bytes(5000) + b"\xff" * 3092
    await raw.close()


async def test_trim_with_allow_discards(port: int, client: httpx.AsyncClient) -> None:
    await make_device(client, "pvd", MIB)
    table = xts_table("pvd", 2048, " 1 allow_discards")
    await make_volume(client, "disc", table, nbd_export=True)
    raw = await RawClient.open(port, "disc")
    assert (await raw.request(Command.WRITE, 0, 8192, payload=b"\x11" * 8192)).error == 0
    assert (await raw.request(Command.TRIM, 100, 8000)).error == 0
    read = await raw.request(Command.READ, 0, 8192)
    assert read.data[:512] == b"\x11" * 512  # the partial block at the edge is kept
    assert read.data[512:7680] != b"\x11" * 7168
    status = (await client.get("/v1/volumes/disc/status")).json()
    assert status["stats"]["d_ios"] >= 1
    await raw.close()


async def test_flush_on_another_connection_covers_writes_of_the_first(
    port: int, exported: str, client: httpx.AsyncClient
) -> None:
    first = await RawClient.open(port, exported)
    second = await RawClient.open(port, exported)
    assert (await first.request(Command.WRITE, 0, 4096, payload=b"\x42" * 4096)).error == 0
    assert (await second.request(Command.FLUSH)).error == 0
    assert (await second.request(Command.READ, 0, 4096)).data == b"\x42" * 4096
    status = (await client.get("/v1/volumes/vol/status")).json()
    assert status["stats"]["f_ios"] == 1
    await first.close()
    await second.close()


async def test_a_suspended_volume_holds_requests_until_resume(
    port: int, exported: str, client: httpx.AsyncClient
) -> None:
    raw = await RawClient.open(port, exported)
    assert (await client.post("/v1/volumes/vol/suspend")).status_code == 200
    handle = raw.send(Command.READ, 0, 512)
    pending = asyncio.ensure_future(raw.answer())
    await asyncio.sleep(0.3)
    assert not pending.done()
    assert (await client.post("/v1/volumes/vol/resume")).status_code == 200
    answer = await asyncio.wait_for(pending, 2)
    assert (answer.handle, answer.error) == (handle, 0)
    await raw.close()


async def test_suspended_longer_than_the_wait_is_eio(
    port: int, exported: str, client: httpx.AsyncClient
) -> None:
    raw = await RawClient.open(port, exported)
    assert (await client.post("/v1/volumes/vol/suspend")).status_code == 200
    answer = await asyncio.wait_for(raw.request(Command.READ, 0, 512), 5)
    assert answer.error == Errno.EIO
    assert "suspended" in answer.message
    await raw.close()


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("DELETE", "/v1/volumes/vol", None),
        ("POST", "/v1/volumes/vol/rename", {"new_name": "other"}),
        ("PATCH", "/v1/volumes/vol", {"nbd_export": False}),
    ],
)
async def test_removed_renamed_or_unexported_volume_closes_its_connections(
    port: int,
    exported: str,
    client: httpx.AsyncClient,
    method: str,
    path: str,
    body: dict[str, object] | None,
) -> None:
    raw = await RawClient.open(port, exported)
    assert (await raw.request(Command.READ, 0, 512)).error == 0
    response = await client.request(method, path, json=body)
    assert response.is_success, response.text
    assert await raw.closed_by_server()


async def test_connections_show_in_volume_info_status_and_metrics(
    port: int, exported: str, client: httpx.AsyncClient
) -> None:
    raw = await RawClient.open(port, exported)
    assert (await raw.request(Command.WRITE, 0, 512, payload=bytes(512))).error == 0
    info = (await client.get("/v1/volumes/vol")).json()
    assert info["nbd_export"] is True
    (connection,) = info["nbd_connections"]
    assert connection["structured_replies"] is True
    assert connection["tls"] is False
    status = (await client.get("/v1/volumes/vol/status")).json()
    assert len(status["nbd"]["connections"]) == 1
    assert status["nbd"]["written_bytes"] == 512
    metrics = (await client.get("/metrics")).text
    assert 'reqcrypt_nbd_requests_total{command="write",volume="vol"} 1.0' in metrics
    assert 'reqcrypt_nbd_connections{volume="vol"} 1.0' in metrics
    await raw.close()


async def test_nbd_export_is_persisted_and_admin_only(
    app: FastAPI, client: httpx.AsyncClient, exported: str
) -> None:
    async with asgi_client(app, IO_TOKEN) as io:
        response = await io.patch("/v1/volumes/vol", json={"nbd_export": False})
        assert response.status_code == 403
    assert (await client.patch("/v1/volumes/vol", json={"nbd_export": False})).json()[
        "nbd_export"
    ] is False
    control = app.state.reqcrypt.control
    control.volumes.clear()
    control.restore()
    assert control.volume("vol").nbd_export is False


async def test_a_client_that_stops_reading_does_not_hold_the_queue(
    port: int, exported: str, app: FastAPI, client: httpx.AsyncClient
) -> None:
    slow = await RawClient.open(port, exported)
    slow.writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    for _ in range(200):
        slow.send(Command.READ, 0, MIB)
    await asyncio.sleep(0.5)
    other = await RawClient.open(port, exported)
    assert (await asyncio.wait_for(other.request(Command.READ, 0, 4096), 5)).error == 0
    response = await client.get("/v1/volumes/vol/data", headers={"Range": "bytes=0-4095"})
    assert response.status_code == 206
    volume = app.state.reqcrypt.control.volume("vol")
    for _ in range(100):
        if volume.in_flight == 0:
            break
        await asyncio.sleep(0.02)
    assert volume.in_flight == 0
    (connection,) = [
        c for c in app.state.reqcrypt.nbd.connections if c.transport.get_write_buffer_size()
    ]
    # It stopped taking requests it cannot answer: its replies wait in a bounded buffer.
    assert connection.transport.get_write_buffer_size() < 80 * MIB
    assert len(connection.buffer) > 0
    await slow.close()
    await other.close()


async def test_a_burst_arriving_within_the_plug_window_is_one_batch(
    port: int, client: httpx.AsyncClient
) -> None:
    await make_device(client, "pvw", MIB)
    await make_volume(
        client, "win", xts_table("pvw", 2048), nbd_export=True, plug_window_us=300_000
    )
    raw = await RawClient.open(port, "win")
    raw.send(Command.WRITE, 0, 4096, payload=b"\x01" * 4096)
    await raw.writer.drain()
    await asyncio.sleep(0.05)
    for i in range(1, 8):
        raw.send(Command.WRITE, i * 4096, 4096, payload=bytes([i + 1]) * 4096)
    answers = [await raw.answer() for _ in range(8)]
    assert all(a.error == 0 for a in answers)
    status = (await client.get("/v1/volumes/win/status")).json()
    assert status["nbd"]["batches"] == 1
    assert status["stats"]["w_ios"] == 1
    await raw.close()


async def test_requests_arriving_while_a_batch_runs_wait_to_form_the_next(
    port: int, exported: str, app: FastAPI, client: httpx.AsyncClient
) -> None:
    raw = await RawClient.open(port, exported)
    assert (await client.post("/v1/volumes/vol/suspend")).status_code == 200
    raw.send(Command.READ, 0, 512)  # its batch waits on the suspended volume
    await raw.writer.drain()
    await asyncio.sleep(0.05)
    for i in range(5):
        raw.send(Command.READ, (i + 1) * 4096, 512)
        await raw.writer.drain()
        await asyncio.sleep(0.02)
    (connection,) = app.state.reqcrypt.nbd.connections
    assert connection.jobs == 1
    assert len(connection.pending) == 5
    big = raw.send(Command.READ, 0, MIB)  # too big to wait: the pending batch starts beside it
    await asyncio.sleep(0.05)
    assert connection.jobs == 2
    assert (await client.post("/v1/volumes/vol/resume")).status_code == 200
    answers = [await raw.answer() for _ in range(7)]
    assert all(a.error == 0 for a in answers)
    assert any(a.handle == big and len(a.data) == MIB for a in answers)
    status = (await client.get("/v1/volumes/vol/status")).json()
    assert status["nbd"]["batches"] == 2
    await raw.close()


async def test_on_a_volume_that_overlaps_batches_a_second_batch_runs_beside_the_first(
    port: int,
    exported: str,
    app: FastAPI,
    client: httpx.AsyncClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Volume, "overlaps_batches", lambda self: True)  # as on RBD
    raw = await RawClient.open(port, exported)
    assert (await client.post("/v1/volumes/vol/suspend")).status_code == 200
    for i in range(3):
        raw.send(Command.READ, i * 4096, 512)  # each batch waits on the suspended volume
        await raw.writer.drain()
        await asyncio.sleep(0.05)
    (connection,) = app.state.reqcrypt.nbd.connections
    assert connection.jobs == OVERLAPPED_JOBS == 2
    assert len(connection.pending) == 1
    assert (await client.post("/v1/volumes/vol/resume")).status_code == 200
    answers = [await raw.answer() for _ in range(3)]
    assert all(a.error == 0 for a in answers)
    status = (await client.get("/v1/volumes/vol/status")).json()
    assert status["nbd"]["batches"] == 3
    await raw.close()


async def test_a_removed_volume_leaves_no_nbd_statistics_behind(
    port: int, exported: str, app: FastAPI, client: httpx.AsyncClient
) -> None:
    raw = await RawClient.open(port, exported)
    assert (await raw.request(Command.READ, 0, 512)).error == 0
    server = app.state.reqcrypt.nbd
    assert len(server.stats) == 1
    assert (await client.delete("/v1/volumes/vol")).status_code == 204
    assert await raw.closed_by_server()
    await asyncio.sleep(0.5)
    assert server.stats == {}


async def test_requests_answered_in_one_burst_form_one_batch_with_those_already_waiting(
    port: int, client: httpx.AsyncClient
) -> None:
    await make_device(client, "pvb", MIB)
    await make_volume(
        client, "burst", xts_table("pvb", 2048), nbd_export=True, plug_window_us=200_000
    )
    raw = await RawClient.open(port, "burst")
    assert (await client.post("/v1/volumes/burst/suspend")).status_code == 200
    first = raw.send(Command.WRITE, 0, 4096, payload=b"\x01" * 4096)
    await raw.writer.drain()
    await asyncio.sleep(0.3)  # its batch has started and waits on the suspended volume
    raw.send(Command.WRITE, 4096, 4096, payload=b"\x02" * 4096)  # waits for the next batch
    await raw.writer.drain()
    assert (await client.post("/v1/volumes/burst/resume")).status_code == 200
    answer = await raw.answer()
    assert answer.handle == first
    raw.send(Command.WRITE, 8192, 4096, payload=b"\x03" * 4096)  # the client's reply to it
    answers = [await raw.answer() for _ in range(2)]
    assert all(a.error == 0 for a in answers)
    status = (await client.get("/v1/volumes/burst/status")).json()
    assert status["nbd"]["batches"] == 2
    assert status["stats"]["w_ios"] == 2  # the second and third merged
    await raw.close()


async def busy_engine(client: httpx.AsyncClient) -> str:
    """An engine whose model takes 2 s a call (unpaced: only its clock says so)."""
    caps = {"chainmodes": ["xts"], "bulk_ivmodes": ["plain64"]}
    cost = {"setup_ns": 2e9, "encrypt_bytes_per_s": 1e12, "decrypt_bytes_per_s": 1e12}
    response = await client.post(
        "/v1/engines", json={"name": "busy", "capabilities": caps, "cost": cost}
    )
    assert response.status_code == 201, response.text
    return "busy"


async def continuing_request_behind_a_held_batch(
    port: int,
    client: httpx.AsyncClient,
    name: str,
    *,
    plug_window_us: int,
    next_offset: int,
    engine: str = "software",
) -> RawClient:
    """A write at 0 answered after a write at ``next_offset`` arrived: that one is pending
    when the client gets its reply, and the client has not answered the reply yet."""
    await make_device(client, f"{name}-pv", MIB)
    await make_volume(
        client,
        name,
        xts_table(f"{name}-pv", 2048),
        nbd_export=True,
        plug_window_us=plug_window_us,
        engine=engine,
    )
    raw = await RawClient.open(port, name)
    assert (await client.post(f"/v1/volumes/{name}/suspend")).status_code == 200
    first = raw.send(Command.WRITE, 0, 4096, payload=b"\x01" * 4096)
    await raw.writer.drain()
    await asyncio.sleep(plug_window_us / 1e6 + 0.1)  # its batch waits on the suspended volume
    raw.send(Command.WRITE, next_offset, 4096, payload=b"\x02" * 4096)
    await raw.writer.drain()
    await asyncio.sleep(0.05)
    assert (await client.post(f"/v1/volumes/{name}/resume")).status_code == 200
    answer = await asyncio.wait_for(raw.answer(), 5)
    assert (answer.handle, answer.error) == (first, 0)
    return raw


async def test_a_stream_waits_while_the_engine_is_busy_for_the_clients_answer_and_merges_with_it(
    port: int, client: httpx.AsyncClient
) -> None:
    engine = await busy_engine(client)
    raw = await continuing_request_behind_a_held_batch(
        port, client, "seq", plug_window_us=10_000, next_offset=4096, engine=engine
    )
    await asyncio.sleep(0.05)  # the client thinks for 5 plug windows before it answers
    raw.send(Command.WRITE, 8192, 4096, payload=b"\x03" * 4096)
    answers = [await asyncio.wait_for(raw.answer(), 5) for _ in range(2)]
    assert all(a.error == 0 for a in answers)
    status = (await client.get("/v1/volumes/seq/status")).json()
    assert status["nbd"]["batches"] == 2
    assert status["stats"]["w_ios"] == 2  # the pending write and the answer merged
    read = await raw.request(Command.READ, 0, 3 * 4096)
    assert read.data == b"\x01" * 4096 + b"\x02" * 4096 + b"\x03" * 4096
    await raw.close()


async def test_a_stream_waits_for_an_answer_that_never_comes_only_so_long(
    port: int, client: httpx.AsyncClient
) -> None:
    engine = await busy_engine(client)
    raw = await continuing_request_behind_a_held_batch(
        port, client, "idle", plug_window_us=10_000, next_offset=4096, engine=engine
    )
    answer = await asyncio.wait_for(raw.answer(), 5)  # after ANTICIPATION plug windows
    assert answer.error == 0
    status = (await client.get("/v1/volumes/idle/status")).json()
    assert status["nbd"]["batches"] == 2
    await raw.close()


@pytest.mark.parametrize(
    ("engine", "next_offset"),
    [("busy", 65536), ("software", 4096)],
    ids=["off-the-stream", "engine-idle"],
)
async def test_without_a_stream_and_a_busy_engine_a_request_waits_only_the_plug_window(
    port: int, client: httpx.AsyncClient, engine: str, next_offset: int
) -> None:
    if engine == "busy":
        await busy_engine(client)
    raw = await continuing_request_behind_a_held_batch(
        port, client, "other", plug_window_us=50_000, next_offset=next_offset, engine=engine
    )
    # Well before ANTICIPATION plug windows: what a continuing request would wait.
    answer = await asyncio.wait_for(raw.answer(), 0.5)
    assert answer.error == 0
    await raw.close()


async def test_a_batch_after_the_io_pool_shut_down_is_answered_eio(
    app: FastAPI, port: int, exported: str
) -> None:
    raw = await RawClient.open(port, exported)
    assert (await raw.request(Command.FLUSH, 0, 0)).error == 0
    app.state.reqcrypt.io_executor.shutdown()
    answer = await asyncio.wait_for(raw.request(Command.FLUSH, 0, 0), 5)
    assert answer.error == Errno.EIO
    await raw.close()


async def test_small_whole_block_io_on_a_file_volume_is_served_on_the_event_loop(
    app: FastAPI, port: int, exported: str
) -> None:
    raw = await RawClient.open(port, exported)
    app.state.reqcrypt.io_executor.shutdown()  # no worker could run it
    assert (await raw.request(Command.WRITE, 0, 4096, payload=b"\x07" * 4096)).error == 0
    answer = await asyncio.wait_for(raw.request(Command.READ, 0, 4096), 5)
    assert (answer.error, answer.data) == (0, b"\x07" * 4096)
    await raw.close()


async def test_an_nbd_request_in_flight_counts_against_the_volume_cap_http_is_held_to(
    app: FastAPI, port: int, exported: str, client: httpx.AsyncClient
) -> None:
    state = app.state.reqcrypt
    state.admission.max_ios = 1
    volume = state.control.volume(exported)
    raw = await RawClient.open(port, exported)
    assert (await client.post("/v1/volumes/vol/suspend")).status_code == 200
    handle = raw.send(Command.READ, 0, 512)  # admitted, then held by the suspended volume
    await raw.writer.drain()
    async with asyncio.timeout(5):
        while state.admission.in_flight(volume) != 1:
            await asyncio.sleep(0.01)
    response = await client.get("/v1/volumes/vol/data", headers={"Range": "bytes=0-511"})
    assert response.status_code == 503
    assert "REQCRYPT_MAX_VOLUME_IOS" in response.json()["detail"]
    assert response.headers["Retry-After"] == "1"
    assert (await client.post("/v1/volumes/vol/resume")).status_code == 200
    answer = await asyncio.wait_for(raw.answer(), 5)
    assert (answer.handle, answer.error) == (handle, 0)
    assert state.admission.in_flight(volume) == 0
    await raw.close()


async def test_an_nbd_request_waits_for_a_slot_the_cap_has_not_free(
    app: FastAPI, port: int, exported: str
) -> None:
    state = app.state.reqcrypt
    state.admission.max_ios = 1
    volume = state.control.volume(exported)
    state.admission.enter(volume)  # what an HTTP I/O in flight holds
    raw = await RawClient.open(port, exported)
    handle = raw.send(Command.WRITE, 0, 4096, payload=b"\x09" * 4096)
    pending = asyncio.ensure_future(raw.answer())
    await asyncio.sleep(0.3)
    assert not pending.done()  # not refused: a block client cannot be told to retry
    assert volume.read(0, 4096) != b"\x09" * 4096
    state.admission.leave(volume)
    answer = await asyncio.wait_for(pending, 5)
    assert (answer.handle, answer.error) == (handle, 0)
    assert volume.read(0, 4096) == b"\x09" * 4096
    assert state.admission.in_flight(volume) == 0
    await raw.close()


async def apply_over_http(
    client: httpx.AsyncClient, volume: str, op: str, offset: int, data: bytes | int
) -> None:
    if op == "write":
        assert isinstance(data, bytes)
        headers = {"Content-Range": f"bytes {offset}-{offset + len(data) - 1}/*"}
        response = await client.put(f"/v1/volumes/{volume}/data", content=data, headers=headers)
    else:
        body = {"offset": offset, "length": data}
        response = await client.post(f"/v1/volumes/{volume}/{op}", json=body)
    assert response.status_code == 204, response.text


async def apply_over_nbd(port: int, volume: str, op: str, offset: int, data: bytes | int) -> None:
    raw = await RawClient.open(port, volume)
    if op == "write":
        assert isinstance(data, bytes)
        answer = await raw.request(Command.WRITE, offset, len(data), payload=data)
    else:
        assert isinstance(data, int)
        command = Command.TRIM if op == "discard" else Command.WRITE_ZEROES
        answer = await raw.request(command, offset, data)
    assert answer.error == 0
    await raw.close()


@pytest.mark.parametrize("front_end", ["http", "nbd"])
async def test_one_partial_block_rule_for_every_front_end(
    port: int, client: httpx.AsyncClient, front_end: str
) -> None:
    """Partial 4 KiB blocks: a write and write-zeroes read-modify-write them, a discard keeps
    them (rounded inward); HTTP and NBD leave the same bytes."""
    await make_device(client, "pvr", MIB)
    table = xts_table("pvr", 2048, " 2 allow_discards sector_size:4096")
    await make_volume(client, "rule", table, nbd_export=True)
    original = bytes(range(256)) * 16 * 6  # six 4 KiB blocks
    await apply_over_http(client, "rule", "write", 0, original)
    steps: list[tuple[str, int, bytes | int]] = [
        ("write", 4000, b"\xaa" * 200),
        ("write-zeroes", 8000, 5000),
        ("discard", 14000, 2 * 4096),  # whole only over block 4 (16384-20479)
    ]
    for op, offset, data in steps:
        if front_end == "http":
            await apply_over_http(client, "rule", op, offset, data)
        else:
            await apply_over_nbd(port, "rule", op, offset, data)
    response = await client.get("/v1/volumes/rule/data", headers={"Range": "bytes=0-24575"})
    read = response.content
    expected = bytearray(original)
    expected[4000:4200] = b"\xaa" * 200
    expected[8000:13000] = bytes(5000)
    assert read[:16384] == expected[:16384]
    assert read[20480:] == expected[20480:]
    assert read[16384:20480] != expected[16384:20480]  # discarded: decrypted zeros
