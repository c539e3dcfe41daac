"""``reqcrypt serve`` as a real process on a loopback port, and what tests send it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from tests.support.app import ADMIN_TOKEN
from tests.support.factories import xts_table
from tests.support.ports import free_port, wait_ready

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


def make_volume(client: httpx.Client, size: int) -> None:
    """Device ``pv`` of ``size`` bytes and volume ``v`` (aes-xts) over all of it."""
    assert client.post("/v1/devices", json={"name": "pv", "size_bytes": size}).status_code == 201
    table = xts_table("pv", size // 512)
    assert client.post("/v1/volumes", json={"name": "v", "table": table}).status_code == 201


def pattern(first: int, length: int) -> bytes:
    """Bytes that name their own offset, so a misplaced chunk cannot pass."""
    words = range(first // 8, (first + length + 7) // 8)
    data = b"".join(word.to_bytes(8, "little") for word in words)
    return data[first % 8 : first % 8 + length]


def serve_refused(data_dir: Path, database_url: str | None = None) -> list[str]:
    """``reqcrypt serve`` expected to stop before it serves: its stderr lines (exit 1)."""
    env = {
        **os.environ,
        "REQCRYPT_DATA_DIR": str(data_dir),
        "REQCRYPT_ADMIN_TOKEN": ADMIN_TOKEN,
        "REQCRYPT_PORT": str(free_port()),
    }
    if database_url is not None:
        env["REQCRYPT_DATABASE_URL"] = database_url
    done = subprocess.run(
        [REQCRYPT, "serve"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Uvicorn running" not in done.stdout + done.stderr
    return done.stderr.strip().splitlines()


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response: status, headers, and as much body as Content-Length says."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        piece = sock.recv(65536)
        assert piece, f"connection closed mid-response: {raw!r}"
        raw += piece
    header_block, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = header_block.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        piece = sock.recv(65536)
        assert piece
        body += piece
    return int(status_line.split()[1]), headers, body
