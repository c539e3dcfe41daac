"""The data path end to end through a real uvicorn on a loopback port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN
from tests.integration.test_deployment import free_port, wait_ready
from tests.support.factories import xts_table

pytestmark = pytest.mark.e2e
MIB = 1 << 20
HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


REQCRYPT = str(Path(sys.executable).with_name("reqcrypt"))


class Server:
    def __init__(self, data_dir: Path, **env: str) -> None:
        self.data_dir = data_dir
        self.env = env
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def environ(self, log_level: str = "warning") -> dict[str, str]:
        """The environment ``reqcrypt serve`` runs with: this process's, plus the server's."""
        return {
            **os.environ,
            "REQCRYPT_DATA_DIR": str(self.data_dir),
            "REQCRYPT_ADMIN_TOKEN": ADMIN_TOKEN,
            "REQCRYPT_PORT": str(self.port),
            "REQCRYPT_LOG_LEVEL": log_level,
            **self.env,
        }

    def start(self) -> None:
        self.process = subprocess.Popen(
            [REQCRYPT, "serve"],
            env=self.environ(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_ready(f"{self.base}/readyz", self.process)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None:
            self.process.send_signal(sig)
            self.process.wait(timeout=15)
            self.process = None

    def peak_rss(self) -> int:
        assert self.process is not None
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        line = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base, headers=HEADERS, timeout=120)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    running = Server(tmp_path / "data", REQCRYPT_MAX_BODY_BYTES=str(512 * MIB))
    running.start()
    try:
        yield running
    finally:
        running.stop()


def make_volume(client: httpx.Client, size: int) -> None:
    assert client.post("/v1/devices", json={"name": "pv", "size_bytes": size}).status_code == 201
    table = xts_table("pv", size // 512)
    assert client.post("/v1/volumes", json={"name": "v", "table": table}).status_code == 201


def pattern(first: int, length: int) -> bytes:
    """Bytes that name their own offset, so a misplaced chunk cannot pass."""
    words = range(first // 8, (first + length + 7) // 8)
    data = b"".join(word.to_bytes(8, "little") for word in words)
    return data[first % 8 : first % 8 + length]


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
