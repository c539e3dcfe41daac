"""Hundreds of hostile or slow clients against a real server with a stated budget
(REQCRYPT_MAX_BUFFERED_BYTES): each pattern an adversarial review found is refused
cleanly or costs a bounded amount, the memory comes back once the clients leave, no
traceback reaches the log, and a well-behaved client is served throughout.

Loopback only, bounded loops; each pattern's figures (idle, peak, after, in MiB) are
printed, and ``tests/bench/test_hostile_latency.py`` reports the well-behaved client's
latency under the same patterns.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.hostile import (
    BUDGET,
    MIB,
    NBD_CONNECTIONS,
    PATTERNS,
    SEND_TIMEOUT,
    VOLUME,
    Figures,
    LoggedServer,
    Pattern,
    attack,
    closed_by_server,
    connections,
    hostile_server,
    metric,
    request,
    trickled_write,
    unread_stream,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MARGIN = 64 * MIB
"""What the process may hold beyond the budget: per-connection state and the answers in
the transports (a piece each); a few MiB for 500 connections in practice."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoggedServer]:
    with hostile_server(tmp_path_factory.mktemp("hostile")) as running:
        yield running


def well_behaved_reads(client: httpx.Client) -> None:
    for index in range(20):
        first = (index * 4096) % VOLUME
        response = client.get(
            "/v1/volumes/v/data", headers={"Range": f"bytes={first}-{first + 4095}"}
        )
        assert response.status_code == 206, response.text


def bounded(name: str, figures: Figures) -> None:
    print(  # noqa: T201 - the note's figures
        f"{name}: idle {figures.idle / MIB:.0f} MiB, peak {figures.peak / MIB:.0f}, "
        f"after {figures.after / MIB:.0f}"
    )
    assert figures.peak <= figures.idle + BUDGET + MARGIN, figures
    assert figures.after <= figures.idle * 1.1, figures


@pytest.mark.parametrize("name", list(PATTERNS))
def test_each_pattern_stays_within_the_budget_and_gives_its_memory_back(
    server: LoggedServer, name: str
) -> None:
    bounded(name, attack(server, PATTERNS[name], well_behaved_reads))


def test_a_reader_that_stops_is_dropped_after_the_send_timeout(server: LoggedServer) -> None:
    with server.client() as client, connections(server, 10) as socks:
        for sock in socks:
            unread_stream(sock)
        wait_for(lambda: metric(client, "reqcrypt_buffered_bytes") > 0, 10)
        started = time.monotonic()
        # The kernel's send buffer takes a little more for a while (autotuning): progress.
        wait_for(lambda: metric(client, "reqcrypt_buffered_bytes") == 0, 8 * SEND_TIMEOUT)
        assert time.monotonic() - started >= SEND_TIMEOUT / 2
        assert closed_by_server(socks[0])


def test_http_connections_past_the_cap_are_answered_503_and_the_others_served(
    server: LoggedServer,
) -> None:
    refused = 0
    with server.client() as client:
        client.get("/readyz")  # its connection is open before the flood
        with connections(server, 1100) as socks:
            well_behaved_reads(client)
            for sock in socks[-200:]:
                sock.settimeout(5)
                with contextlib.suppress(OSError):
                    refused += sock.recv(4096).startswith(b"HTTP/1.1 503")
    assert refused >= 90  # 1,100 + the well-behaved one against a cap of 1,000


def test_nbd_connections_past_the_cap_are_closed_at_once(server: LoggedServer) -> None:
    with connections(server, 2 * NBD_CONNECTIONS, server.nbd_port) as socks:
        closed = 0
        for sock in socks[NBD_CONNECTIONS:]:
            sock.settimeout(5)
            with contextlib.suppress(OSError):
                closed += sock.recv(4096) == b""
    assert closed == NBD_CONNECTIONS


def test_repeated_attacks_leave_nothing_behind(server: LoggedServer) -> None:
    """Clients that reset their connections: each round's memory is back before the next
    (uvicorn's keep-alive timer would hold a reset connection for timeout_keep_alive)."""
    resets = Pattern(trickled_write)
    first = attack(server, resets, well_behaved_reads)
    for _ in range(3):
        last = attack(server, resets, well_behaved_reads)
    assert last.after <= first.idle * 1.05, (first, last)


def test_no_traceback_for_malformed_framing_or_an_abandoned_body(server: LoggedServer) -> None:
    with connections(server, 20) as socks:
        for sock in socks[:10]:
            request(sock, f"POST /v1/devices HTTP/1.1\r\nContent-Length: {'0' * 4301}5", b"{}")
        for sock in socks[10:]:
            request(
                sock,
                "PUT /v1/volumes/v/data HTTP/1.1\r\n"
                f"Content-Range: bytes 0-{MIB - 1}/*\r\nContent-Length: {MIB}",
                b"x" * 65536,
            )
        time.sleep(0.5)
    time.sleep(0.5)
    log = server.log.read_text()
    assert "Traceback" not in log
    assert "Exception in ASGI application" not in log


def test_the_budget_metric_says_what_a_held_answer_costs(server: LoggedServer) -> None:
    with server.client() as client, connections(server, 1) as (sock,):
        unread_stream(sock)
        wait_for(lambda: metric(client, "reqcrypt_buffered_bytes") > 0, 10)
        # The chunk waiting to be sent, and the one or two the transport still holds part of.
        assert metric(client, "reqcrypt_buffered_bytes") <= 3 * MIB
        assert metric(client, "reqcrypt_buffered_bytes_limit") == BUDGET
