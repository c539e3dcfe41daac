"""Slow and idle clients against a real uvicorn, over raw sockets.

A client trickling a body holds only its own connection: other clients' I/O on
the same volume and on others goes on, and the trickler gets 408 once its body
deadline passes, with nothing written. Idle keep-alive connections are closed,
and so are connections that never send a request; a request's line and headers
must arrive within REQCRYPT_HEAD_TIMEOUT_SECONDS and 64 KiB (slowloris gets 408,
a huge head 431). Oversized bodies are refused from their headers alone, a
streamed read abandoned half-way gives its volume slot back, and a 500 that ends
its connection says ``Connection: close``.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from app.api.connections import MAX_HEAD_BYTES
from app.config import Settings
from app.main import create_app, http_protocol
from tests.support.app import ADMIN_TOKEN
from tests.support.factories import xts_table
from tests.support.ports import free_port
from tests.support.servers import MIB, Server, read_response

pytestmark = pytest.mark.e2e

BODY_TIMEOUT = 5
HEAD_TIMEOUT = 2
VOLUME_IOS = 4


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(
        tmp_path_factory.mktemp("slow") / "data",
        REQCRYPT_BODY_TIMEOUT_SECONDS=str(BODY_TIMEOUT),
        REQCRYPT_KEEP_ALIVE_SECONDS="1",
        REQCRYPT_HEAD_TIMEOUT_SECONDS=str(HEAD_TIMEOUT),
        REQCRYPT_MAX_BODY_BYTES=str(MIB),
        REQCRYPT_MAX_VOLUME_IOS=str(VOLUME_IOS),
    )
    running.start()
    try:
        with running.client() as client:
            for name in ("a", "b"):
                response = client.post("/v1/devices", json={"name": name, "size_bytes": 16 * MIB})
                assert response.status_code == 201
                table = xts_table(name, 16 * MIB // 512)
                response = client.post("/v1/volumes", json={"name": name, "table": table})
                assert response.status_code == 201
        yield running
    finally:
        # A failed test may leave a request waiting on a body: uvicorn would wait for it.
        with contextlib.suppress(subprocess.TimeoutExpired):
            running.stop()
        if running.process is not None:
            running.process.kill()
            running.process.wait()


def connect(server: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


def head(method: str, path: str, **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {ADMIN_TOKEN}"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def nothing_to_read(sock: socket.socket) -> bool:
    timeout = sock.gettimeout()
    sock.setblocking(False)
    try:
        sock.recv(1)
    except BlockingIOError:
        return True
    finally:
        sock.settimeout(timeout)
    return False


@pytest.mark.slow
def test_trickling_bodies_block_no_one_and_end_in_408_with_nothing_written(
    server: Server,
) -> None:
    with server.client() as client, contextlib.ExitStack() as stack:
        before = client.get("/v1/volumes/a/data", headers={"Range": "bytes=0-65535"}).content
        tricklers = []
        for _ in range(VOLUME_IOS - 1):
            sock = stack.enter_context(connect(server))
            sock.sendall(
                head(
                    "PUT",
                    "/v1/volumes/a/data",
                    Content_Range="bytes 0-65535/*",
                    Content_Length="65536",
                )
                + b"\xaa" * 100
            )
            tricklers.append(sock)
        for round_ in range(20):
            data = bytes([round_]) * 4096
            for volume in ("a", "b"):
                first = MIB + round_ * 4096
                response = client.put(
                    f"/v1/volumes/{volume}/data",
                    content=data,
                    headers={"Content-Range": f"bytes {first}-{first + 4095}/*"},
                )
                assert response.status_code == 204, response.text
                back = client.get(
                    f"/v1/volumes/{volume}/data",
                    headers={"Range": f"bytes={first}-{first + 4095}"},
                )
                assert back.content == data
        # All that I/O was served while every trickler was still waiting on its body.
        assert all(nothing_to_read(sock) for sock in tricklers)
        for sock in tricklers:
            sock.sendall(b"\xaa")  # a trickle, not a stop: the overall deadline still applies
        for sock in tricklers:
            status, headers, body = read_response(sock)
            assert status == 408
            assert headers["content-type"] == "application/problem+json"
            assert b"REQCRYPT_BODY_TIMEOUT_SECONDS" in body
            assert closed_by_server(sock)
        after = client.get("/v1/volumes/a/data", headers={"Range": "bytes=0-65535"}).content
        assert after == before


def test_an_idle_keep_alive_connection_is_closed_after_keep_alive_seconds(
    server: Server,
) -> None:
    with connect(server) as sock:
        sock.sendall(head("GET", "/healthz"))
        status, headers, _ = read_response(sock)
        assert status == 200
        assert headers.get("connection", "keep-alive") != "close"
        # REQCRYPT_KEEP_ALIVE_SECONDS=1; uvicorn's own default (5 s) would outlast this.
        sock.settimeout(4)
        assert closed_by_server(sock)


def test_an_oversized_body_is_refused_from_its_headers_before_any_byte_is_sent(
    server: Server,
) -> None:
    with connect(server) as sock:
        size = 2 * MIB
        sock.sendall(
            head(
                "PUT",
                "/v1/volumes/b/data",
                Content_Range=f"bytes 0-{size - 1}/*",
                Content_Length=str(size),
            )
        )
        status, headers, body = read_response(sock)
        assert status == 413
        assert headers["content-type"] == "application/problem+json"
        assert str(size).encode() in body


def test_an_abandoned_streamed_read_gives_its_volume_slot_back(server: Server) -> None:
    readers = []
    for _ in range(VOLUME_IOS):
        sock = connect(server)
        sock.sendall(head("GET", "/v1/volumes/b/data"))
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        readers.append(sock)
    with server.client() as client:
        refused = client.get("/v1/volumes/b/data", headers={"Range": "bytes=0-511"})
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        for sock in readers:
            sock.close()
        deadline = time.monotonic() + 30
        while True:
            response = client.get("/v1/volumes/b/data", headers={"Range": "bytes=0-511"})
            if response.status_code == 206 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert response.status_code == 206


def closed_within(sock: socket.socket, seconds: float) -> float:
    """How long the server took to close ``sock`` (fails past ``seconds``)."""
    start = time.monotonic()
    sock.settimeout(seconds)
    assert closed_by_server(sock)
    return time.monotonic() - start


def test_a_connection_that_never_sends_a_request_is_closed_after_the_head_timeout(
    server: Server,
) -> None:
    with connect(server) as sock:
        waited = closed_within(sock, HEAD_TIMEOUT + 3)
    assert waited >= HEAD_TIMEOUT - 0.5


def test_headers_trickled_byte_by_byte_get_408_at_the_head_timeout(server: Server) -> None:
    request = head("GET", "/healthz", X_Padding="p" * 200)
    with connect(server) as sock:
        start = time.monotonic()
        status = None
        for byte in request:  # each byte well inside the keep-alive and head timeouts alone
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.05)
            if time.monotonic() - start > HEAD_TIMEOUT + 3:
                break
        status, headers, body = read_response(sock)
        assert status == 408
        assert headers["connection"] == "close"
        assert b"REQCRYPT_HEAD_TIMEOUT_SECONDS" in body
        assert closed_by_server(sock)
        assert time.monotonic() - start < HEAD_TIMEOUT + 3


def test_a_keep_alive_connections_next_request_has_the_same_head_deadline(
    server: Server,
) -> None:
    with connect(server) as sock:
        sock.sendall(head("GET", "/healthz"))
        assert read_response(sock)[0] == 200
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # within keep-alive; the rest never comes
        status, headers, _ = read_response(sock)
        assert status == 408
        assert headers["connection"] == "close"


def test_a_head_over_64_kib_gets_431_and_the_connection_closes(server: Server) -> None:
    with connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        filler = b"X-Filler: " + b"f" * 1000 + b"\r\n"
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for _ in range(MAX_HEAD_BYTES // len(filler) + 2):
                sock.sendall(filler)
        status, headers, _ = read_response(sock)
        assert status == 431
        assert headers["connection"] == "close"
        assert closed_by_server(sock)


@contextlib.contextmanager
def uvicorn_serving(settings: Settings) -> Iterator[int]:
    """The app with one route that fails unexpectedly, under uvicorn as ``serve`` runs it."""
    application = create_app(settings)

    @application.get("/boom")
    def boom() -> None:
        raise RuntimeError("unexpected")

    port = free_port()
    config = uvicorn.Config(
        application,
        host="127.0.0.1",
        port=port,
        log_level="critical",
        http=http_protocol(settings),
    )
    runner = uvicorn.Server(config)
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not runner.started:
            assert thread.is_alive()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        yield port
    finally:
        runner.should_exit = True
        thread.join(timeout=30)


def test_a_500_that_closes_its_connection_says_connection_close(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", admin_token=ADMIN_TOKEN)  # type: ignore[arg-type]
    with (
        uvicorn_serving(settings) as port,
        socket.create_connection(("127.0.0.1", port), timeout=30) as sock,
    ):
        sock.sendall(head("GET", "/boom"))
        status, headers, _ = read_response(sock)
        assert status == 500
        assert headers["connection"] == "close"
        assert closed_by_server(sock)
