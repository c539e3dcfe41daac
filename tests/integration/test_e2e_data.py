"""The data path end to end through a real uvicorn on a loopback port."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.servers import MIB, Server, make_volume, pattern

pytestmark = pytest.mark.e2e


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    running = Server(tmp_path / "data", REQCRYPT_MAX_BODY_BYTES=str(512 * MIB))
    running.start()
    try:
        yield running
    finally:
        running.stop()


def test_unaligned_write_and_ranged_reads_over_real_http(server: Server) -> None:
    with server.client() as client:
        make_volume(client, 4 * MIB)
        data = pattern(1000, 70_000)
        response = client.put(
            "/v1/volumes/v/data",
            content=data,
            headers={"Content-Range": f"bytes 1000-{1000 + len(data) - 1}/*"},
        )
        assert response.status_code == 204
        back = client.get("/v1/volumes/v/data", headers={"Range": "bytes=1000-70999"})
        assert back.status_code == 206
        assert back.content == data
        assert client.post("/v1/volumes/v/flush").status_code == 204
        head = client.head("/v1/volumes/v/data")
        assert head.headers["content-length"] == str(4 * MIB)
        assert head.headers["etag"] == back.headers["etag"]


def test_acknowledged_write_survives_a_killed_process(server: Server) -> None:
    with server.client() as client:
        make_volume(client, MIB)
        data = pattern(0, 65536)
        response = client.put(
            "/v1/volumes/v/data", content=data, headers={"Content-Range": "bytes 0-65535/*"}
        )
        assert response.status_code == 204
    server.stop(signal.SIGKILL)
    server.start()
    with server.client() as client:
        back = client.get("/v1/volumes/v/data", headers={"Range": "bytes=0-65535"})
        assert back.content == data


def test_oversized_body_is_413_before_it_is_read(tmp_path: Path) -> None:
    small = Server(tmp_path / "small", REQCRYPT_MAX_BODY_BYTES=str(MIB))
    small.start()
    try:
        with small.client() as client:
            make_volume(client, 4 * MIB)
            response = client.put(
                "/v1/volumes/v/data",
                content=bytes(2 * MIB),
                headers={"Content-Range": f"bytes 0-{2 * MIB - 1}/*"},
            )
            assert response.status_code == 413
    finally:
        small.stop()


@pytest.mark.slow
def test_256_mib_put_and_get_stream_within_the_memory_bound(server: Server) -> None:
    total = 256 * MIB
    piece = 4 * MIB
    with server.client() as client:
        make_volume(client, total)
        before = server.peak_rss()

        def body() -> Iterator[bytes]:
            for first in range(0, total, piece):
                yield pattern(first, piece)

        response = client.put(
            "/v1/volumes/v/data",
            content=body(),
            headers={"Content-Range": f"bytes 0-{total - 1}/*", "Content-Length": str(total)},
        )
        assert response.status_code == 204
        received = 0
        with client.stream("GET", "/v1/volumes/v/data") as stream:
            assert stream.status_code == 200
            for chunk in stream.iter_bytes(piece):
                if received % (32 * MIB) == 0:
                    assert chunk[:4096] == pattern(received, 4096)
                received += len(chunk)
        assert received == total
        growth = server.peak_rss() - before
        assert growth <= 64 * MIB, f"server peak RSS grew by {growth / MIB:.1f} MiB"
