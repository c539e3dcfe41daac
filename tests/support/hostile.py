"""Hostile and slow clients, over raw loopback sockets, against a real ``reqcrypt serve``
with a stated budget: the server, the patterns an adversarial review found, and the memory
figures of an attack (shared by the hostile-clients test and its latency benchmark)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.ports import free_port, wait_ready
from tests.support.servers import HEADERS, MIB, REQCRYPT, Server, make_volume, read_response

BUDGET = 96 * MIB
VOLUME = 64 * MIB
CONNECTIONS = 500
SEND_TIMEOUT = 2
NBD_CONNECTIONS = 256
TOKEN = HEADERS["Authorization"]


class LoggedServer(Server):
    """``reqcrypt serve`` with its log kept, and its memory read from /proc."""

    def __init__(self, data_dir: Path, log: Path, **env: str) -> None:
        super().__init__(data_dir, **env)
        self.log = log
        self.nbd_port = int(env.get("REQCRYPT_NBD_PORT", "0"))

    def start(self) -> None:
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [REQCRYPT, "serve"], env=self.environ(), stdout=log, stderr=log
            )
        wait_ready(f"{self.base}/readyz", self.process)

    def status(self, field: str) -> int:
        assert self.process is not None
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        line = next(line for line in status.splitlines() if line.startswith(field + ":"))
        return int(line.split()[1]) * 1024

    def reset_peak(self) -> None:
        assert self.process is not None
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")


@dataclass
class Figures:
    idle: int
    peak: int
    after: int


def metric(client: httpx.Client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def wait_for(condition: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@contextlib.contextmanager
def hostile_server(base: Path) -> Iterator[LoggedServer]:
    """A server with volume ``v`` (``VOLUME`` bytes), the budget and short timeouts, warmed
    up; a long keep-alive, as a reset connection must not wait for it to be freed."""
    running = LoggedServer(
        base / "data",
        base / "serve.log",
        REQCRYPT_MAX_BUFFERED_BYTES=str(BUDGET),
        REQCRYPT_SEND_TIMEOUT_SECONDS=str(SEND_TIMEOUT),
        REQCRYPT_BODY_TIMEOUT_SECONDS="5",
        REQCRYPT_HEAD_TIMEOUT_SECONDS="5",
        REQCRYPT_KEEP_ALIVE_SECONDS="30",
        REQCRYPT_MAX_CONNECTIONS="1000",
        REQCRYPT_MAX_VOLUME_IOS="4096",
        REQCRYPT_NBD_PORT=str(free_port()),
        REQCRYPT_NBD_MAX_CONNECTIONS=str(NBD_CONNECTIONS),
    )
    running.start()
    try:
        with running.client() as client:
            make_volume(client, VOLUME)
            warm_up(running, client)
        yield running
    finally:
        running.stop()


def warm_up(server: Server, client: httpx.Client) -> None:
    """Every kind of answer a pattern asks for, and enough at once to start every I/O
    worker thread (bounded): idle then means a server that has worked, not an unstarted one."""
    assert client.get("/v1/volumes/v/data").status_code == 200
    ranges = {"Range": "bytes=0-8388607,16777216-25165823"}
    assert client.get("/v1/volumes/v/data", headers=ranges).status_code == 206
    put = client.put(
        "/v1/volumes/v/data",
        content=b"w" * (4 * MIB),
        headers={"Content-Range": "bytes 0-4194303/*"},
    )
    assert put.status_code == 204
    socks = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(96)]
    try:
        for index, sock in enumerate(socks):
            first = index * MIB % VOLUME
            request(
                sock, f"GET /v1/volumes/v/data HTTP/1.1\r\nRange: bytes={first}-{first + MIB - 1}"
            )
        for sock in socks:
            assert read_response(sock)[0] == 206
    finally:
        for sock in socks:
            sock.close()


@contextlib.contextmanager
def connections(
    server: Server, count: int, port: int | None = None
) -> Iterator[list[socket.socket]]:
    """``count`` client sockets that read (almost) nothing: a 4 KiB receive buffer."""
    opened: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.settimeout(10)
            sock.connect(("127.0.0.1", port or server.port))
            opened.append(sock)
        yield opened
    finally:
        for sock in opened:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
            sock.close()


def closed_by_server(sock: socket.socket) -> bool:
    """What the socket still holds read, then the end of the stream or a reset (True), or
    nothing more for 5 s (False)."""
    sock.settimeout(5)
    try:
        while sock.recv(1 << 20):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


def request(sock: socket.socket, head: str, body: bytes = b"") -> None:
    sock.sendall(f"{head}\r\nHost: x\r\nAuthorization: {TOKEN}\r\n\r\n".encode() + body)


def unread_multi_range(sock: socket.socket) -> None:
    request(sock, "GET /v1/volumes/v/data HTTP/1.1\r\nRange: bytes=0-8388607,16777216-25165823")


def unread_stream(sock: socket.socket) -> None:
    request(sock, "GET /v1/volumes/v/data HTTP/1.1")


def trickled_multipart(sock: socket.socket) -> None:
    request(
        sock,
        "PUT /v1/volumes/v/data HTTP/1.1\r\n"
        "Content-Type: multipart/byteranges; boundary=b\r\n"
        f"Content-Length: {64 * MIB}",
        b"--",
    )


def trickled_write(sock: socket.socket) -> None:
    request(
        sock,
        "PUT /v1/volumes/v/data HTTP/1.1\r\n"
        f"Content-Range: bytes 0-{32 * MIB - 1}/*\r\nContent-Length: {32 * MIB}",
        b"ww",
    )


def idle(sock: socket.socket) -> None:
    """Connects, and sends nothing."""


@dataclass(frozen=True)
class Pattern:
    send: Callable[[socket.socket], None]
    connections: int = CONNECTIONS
    nbd: bool = False


PATTERNS = {
    "unread multi-range answers": Pattern(unread_multi_range),
    "unread streams": Pattern(unread_stream),
    "trickled multipart bodies": Pattern(trickled_multipart),
    "trickled writes": Pattern(trickled_write),
    "idle HTTP connections past the cap": Pattern(idle, 1100),
    "idle NBD connections past the cap": Pattern(idle, 1000, nbd=True),
}


def attack(
    server: LoggedServer,
    pattern: Pattern,
    during: Callable[[httpx.Client], None],
) -> Figures:
    """The pattern's clients each send, then ``during`` runs as a well-behaved client; the
    server's RSS idle before, at its peak, and after the clients have left and the budget
    is back to nothing."""
    with server.client() as client:
        wait_for(lambda: metric(client, "reqcrypt_buffered_bytes") == 0, 30)
        resting = server.status("VmRSS")
        server.reset_peak()
        port = server.nbd_port if pattern.nbd else None
        with connections(server, pattern.connections, port) as socks:
            for sock in socks:
                pattern.send(sock)
            time.sleep(0.5)
            during(client)
            peak = server.status("VmHWM")
        wait_for(lambda: metric(client, "reqcrypt_buffered_bytes") == 0, 30)
        time.sleep(0.5)  # the freed heap handed back off the loop
        after = server.status("VmRSS")
    return Figures(resting, peak, after)
