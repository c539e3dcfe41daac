"""Loopback ports for real servers, and waiting for one to answer."""

from __future__ import annotations

import http.client
import socket
import subprocess
import time
from urllib.parse import urlsplit

POLL_SECONDS = 0.02
"""How often a starting server is asked whether it is ready: a test waits at most this
long past the moment it is."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def answers_ok(url: str, timeout: float = 2) -> bool:
    """Whether GET ``url`` answers 200 now; no connection is a no. A bare ``http.client``
    request costs ~0.05 ms of CPU, where ``httpx.get`` builds a client and its TLS context
    (~20 ms) every time, taken from the server starting beside it."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    try:
        connection.request("GET", parts.path or "/")
        return connection.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def wait_ready(
    url: str, process: subprocess.Popen[bytes], seconds: float = 30, name: str | None = None
) -> None:
    """Until GET ``url`` answers 200, while ``process`` runs, for at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = process.stdout.read().decode() if process.stdout else ""
            raise AssertionError(f"{name} exited" if name else output)
        if answers_ok(url):
            return
        time.sleep(POLL_SECONDS)
    raise AssertionError(f"{name or url} never became ready")
