"""Request bodies received straight into the route's buffer (``BodySink``), through a real
uvicorn, sent the awkward ways a client may send them: pieces that straddle the chunks
a PUT is written in, bytes that arrive with the head (before the route runs),
``Expect: 100-continue``, pipelined requests, a client gone mid-body, a multipart batch."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.app import ADMIN_TOKEN
from tests.support.servers import MIB, Server, make_volume, pattern, read_response

pytestmark = pytest.mark.e2e

CHUNK = 64 << 10
"""REQCRYPT_IO_CHUNK_BYTES of the server: a PUT of a few hundred KiB spans several chunks."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("bodies") / "data", REQCRYPT_IO_CHUNK_BYTES=str(CHUNK))
    running.start()
    try:
        with running.client() as client:
            make_volume(client, 4 * MIB)
        yield running
    finally:
        running.stop()


def put_head(first: int, length: int, **headers: str) -> bytes:
    lines = [
        "PUT /v1/volumes/v/data HTTP/1.1",
        "Host: 127.0.0.1",
        f"Authorization: Bearer {ADMIN_TOKEN}",
        f"Content-Range: bytes {first}-{first + length - 1}/*",
        f"Content-Length: {length}",
    ]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def connect(server: Server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_back(server: Server, first: int, length: int) -> bytes:
    with server.client() as client:
        response = client.get(
            "/v1/volumes/v/data", headers={"Range": f"bytes={first}-{first + length - 1}"}
        )
        assert response.status_code == 206
        return response.content


@pytest.mark.parametrize("piece", [1, 4093, 65537])
def test_a_body_in_odd_pieces_lands_whole_across_chunks(server: Server, piece: int) -> None:
    """An unaligned PUT over several chunks, its first piece sent with the head."""
    first, length = 1000 + piece, 5 * CHUNK + 777
    data = pattern(first, length)
    pieces = [data[i : i + piece] for i in range(0, length, piece)] if piece > 1 else [data]
    with connect(server) as sock:
        sock.sendall(put_head(first, length) + pieces[0][: piece // 2 + 1])
        rest = pieces[0][piece // 2 + 1 :], *pieces[1:]
        for index, part in enumerate(rest):
            sock.sendall(part)
            if index % 3 == 0:
                time.sleep(0.002)
        status, headers, _ = read_response(sock)
    assert status == 204, headers
    assert read_back(server, first, length) == data


def test_expect_100_continue_is_answered_before_the_body(server: Server) -> None:
    length = 2 * CHUNK + 10
    data = pattern(7, length)
    with connect(server) as sock:
        sock.sendall(put_head(7, length, Expect="100-continue"))
        assert sock.recv(64) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(data)
        status, _, _ = read_response(sock)
    assert status == 204
    assert read_back(server, 7, length) == data


def test_pipelined_puts_each_get_their_own_body(server: Server) -> None:
    first_data, second_data = pattern(0, CHUNK + 5), pattern(3 * MIB, 3 * CHUNK)
    with connect(server) as sock:
        sock.sendall(
            put_head(0, len(first_data))
            + first_data
            + put_head(3 * MIB, len(second_data))
            + second_data
        )
        answers = b""
        while answers.count(b"HTTP/1.1 204") < 2:
            piece = sock.recv(65536)
            assert piece, answers
            answers += piece
    assert read_back(server, 0, len(first_data)) == first_data
    assert read_back(server, 3 * MIB, len(second_data)) == second_data


def test_a_client_gone_mid_body_leaves_the_server_serving(server: Server) -> None:
    data = pattern(2 * MIB, CHUNK)
    with connect(server) as sock:
        sock.sendall(put_head(2 * MIB, 4 * CHUNK) + bytes(CHUNK + 100))
        time.sleep(0.2)
    with server.client() as client:
        for _ in range(50):  # the abandoned PUT's slot is given back once its task ends
            response = client.put(
                "/v1/volumes/v/data",
                content=data,
                headers={"Content-Range": f"bytes {2 * MIB}-{2 * MIB + CHUNK - 1}/*"},
            )
            if response.status_code == 204:
                break
            time.sleep(0.1)
        assert response.status_code == 204
    assert read_back(server, 2 * MIB, CHUNK) == data


def test_a_body_shorter_than_its_content_length_is_never_answered_204(server: Server) -> None:
    with connect(server) as sock:
        sock.sendall(put_head(0, 3 * CHUNK) + bytes(CHUNK))
        sock.shutdown(socket.SHUT_WR)
        assert b"HTTP/1.1 204" not in sock.recv(65536)


def test_a_multipart_batch_over_real_http(server: Server) -> None:
    parts = [(5000, pattern(5000, 3 * CHUNK)), (1_000_000, pattern(1_000_000, 700))]
    boundary = "sinkbatch"
    body = b"".join(
        f"--{boundary}\r\nContent-Range: bytes {first}-{first + len(data) - 1}/*\r\n\r\n".encode()
        + data
        + b"\r\n"
        for first, data in parts
    )
    body += f"--{boundary}--\r\n".encode()
    with server.client() as client:
        response = client.put(
            "/v1/volumes/v/data",
            content=body,
            headers={"Content-Type": f"multipart/byteranges; boundary={boundary}"},
        )
        assert response.status_code == 204, response.text
    for first, data in parts:
        assert read_back(server, first, len(data)) == data


def test_the_null_endpoint_takes_a_body_in_pieces(tmp_path: Path) -> None:
    ceiling = Server(tmp_path / "data", REQCRYPT_BENCH_CEILING="1")
    ceiling.start()
    try:
        with ceiling.client() as client:

            def body() -> Iterator[bytes]:
                for _ in range(5):
                    yield bytes(300_001)

            response = client.put(
                "/v1/null/data", content=body(), headers={"Content-Length": str(5 * 300_001)}
            )
            assert response.status_code == 204
            assert client.get("/readyz").status_code == 200
    finally:
        ceiling.stop()


@pytest.mark.slow
def test_a_route_busy_past_the_body_timeout_does_not_time_the_client_out(tmp_path: Path) -> None:
    """The per-piece body deadline counts from when the route asks for the next piece: a
    write waiting on a suspended volume for longer than it keeps the client's body coming."""
    slow = Server(
        tmp_path / "data", REQCRYPT_IO_CHUNK_BYTES=str(CHUNK), REQCRYPT_BODY_TIMEOUT_SECONDS="1"
    )
    slow.start()
    try:
        with slow.client() as client:
            make_volume(client, MIB)
            assert client.post("/v1/volumes/v/suspend").status_code == 200
            data = pattern(0, 4 * CHUNK)
            with connect(slow) as sock:
                sock.sendall(put_head(0, len(data)) + data)
                time.sleep(2.5)  # the first chunk's write waits for resume
                assert client.post("/v1/volumes/v/resume").status_code == 200
                status, headers, _ = read_response(sock)
            assert status == 204, headers
            back = client.get("/v1/volumes/v/data", headers={"Range": f"bytes=0-{len(data) - 1}"})
            assert back.content == data
    finally:
        slow.stop()
