"""The fault harness of tests/support/faults.py, checked on its own before cluster tests
lean on it: the proxy forwards, delays, drops and cuts; a network namespace reaches
PostgreSQL only through its proxy, is reachable from the host until its link is cut, and
leaves nothing behind; a paused process is always continued."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support.database import POSTGRES_ADMIN_DSN
from tests.support.faults import (
    FaultProxy,
    NetNamespace,
    Pauser,
    faults_available,
    is_stopped,
    namespaces,
)

ECHO_INSIDE = """
import socket, sys
server = socket.create_server(("0.0.0.0", int(sys.argv[1])))
while True:
    conn, _ = server.accept()
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)
"""
"""An echo server run inside a namespace, one connection at a time."""

SSL_REQUEST = """
import socket, struct, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2) as conn:
    conn.sendall(struct.pack("!ii", 8, 80877103))
    sys.exit(0 if conn.recv(1) in (b"S", b"N") else 1)
"""
"""PostgreSQL's SSLRequest: any PostgreSQL answers S or N before any authentication."""

INSIDE_PORT = 8080
"""Free in any new namespace: it has its own ports."""


@contextlib.contextmanager
def echo_server() -> Iterator[tuple[str, int]]:
    """An echo server on a loopback port, a thread per connection; every thread polls a
    stop flag, so leaving the block joins them all."""
    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)
    threads: list[threading.Thread] = []

    def echo(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(0.2)
            while not stop.is_set():
                try:
                    data = conn.recv(65536)
                    if not data:
                        return
                    conn.sendall(data)
                except TimeoutError:
                    continue
                except OSError:
                    return

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=echo, args=(conn,), daemon=True)
            threads.append(thread)
            thread.start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield listener.getsockname()
    finally:
        stop.set()
        acceptor.join(2)
        for thread in threads:
            thread.join(2)
        listener.close()


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    with echo_server() as address:
        yield address


@pytest.fixture
def proxy(echo: tuple[str, int]) -> Iterator[FaultProxy]:
    with FaultProxy(echo) as running:
        yield running


@pytest.fixture
def namespace() -> Iterator[NetNamespace]:
    available, reason = faults_available()
    if not available:
        pytest.skip(reason)
    with NetNamespace() as created:
        yield created
    assert created.name not in namespaces()


def connect(address: tuple[str, int], timeout: float = 2) -> socket.socket:
    return socket.create_connection(address, timeout=timeout)


def receive(sock: socket.socket, size: int) -> bytes:
    """Exactly ``size`` bytes, or what came before EOF."""
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def round_trip(sock: socket.socket, message: bytes) -> bytes:
    sock.sendall(message)
    return receive(sock, len(message))


def reset_on_arrival(address: tuple[str, int]) -> bool:
    """Whether a new connection is reset at once: the reset reaches the client in its
    connect() or its first recv(), depending on which comes first."""
    try:
        with connect(address) as sock:
            sock.recv(16)
    except ConnectionResetError:
        return True
    return False


def wait_connectable(address: tuple[str, int], seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            connect(address, 0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def test_the_proxy_forwards_bytes_both_ways_and_counts_them(proxy: FaultProxy) -> None:
    payload = os.urandom(3 << 20)
    with connect(proxy.address, 5) as sock:
        assert round_trip(sock, b"hello") == b"hello"
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        echoed = receive(sock, len(payload))
        sender.join(5)
    assert echoed == payload
    stats = proxy.stats()
    assert (stats.accepted, stats.refused) == (1, 0)
    assert stats.bytes_up == stats.bytes_down == len(payload) + 5


def test_delay_holds_every_chunk_both_ways_in_order_and_pass_releases_at_once(
    proxy: FaultProxy,
) -> None:
    with connect(proxy.address) as sock:
        assert round_trip(sock, b"warm") == b"warm"
        proxy.delay(0.3)
        started = time.monotonic()
        messages = [b"%03d" % number for number in range(20)]
        for message in messages:
            sock.sendall(message)
            time.sleep(0.005)
        assert receive(sock, 60) == b"".join(messages)
        assert time.monotonic() - started >= 0.6
        sock.sendall(b"held")
        proxy.pass_()
        started = time.monotonic()
        assert receive(sock, 4) == b"held"
        assert time.monotonic() - started < 0.25


def test_drop_black_holes_traffic_and_restore_lets_it_through_intact(proxy: FaultProxy) -> None:
    with connect(proxy.address) as old:
        assert round_trip(old, b"before") == b"before"
        proxy.drop()
        old.settimeout(0.5)
        old.sendall(b"held")
        with pytest.raises(TimeoutError):
            old.recv(16)
        with connect(proxy.address, 0.5) as new:
            new.sendall(b"lost")
            with pytest.raises(TimeoutError):
                new.recv(16)
        assert proxy.stats().bytes_up == len(b"before")
        proxy.restore()
        old.settimeout(2)
        assert receive(old, 4) == b"held"
    with connect(proxy.address) as fresh:
        assert round_trip(fresh, b"after") == b"after"


def test_cut_resets_open_connections_and_refuses_new_ones_until_restored(
    proxy: FaultProxy,
) -> None:
    with connect(proxy.address) as old:
        assert round_trip(old, b"before") == b"before"
        proxy.cut()
        with pytest.raises(ConnectionResetError):
            old.recv(16)
    assert reset_on_arrival(proxy.address)
    assert proxy.stats().refused == 1
    proxy.restore()
    with connect(proxy.address) as fresh:
        assert round_trip(fresh, b"after") == b"after"


def test_close_returns_promptly_with_connections_open_and_held(echo: tuple[str, int]) -> None:
    with contextlib.ExitStack() as stack:
        proxy = FaultProxy(echo)
        clients = [stack.enter_context(connect(proxy.address)) for _ in range(3)]
        assert round_trip(clients[0], b"up") == b"up"
        proxy.delay(10)
        clients[1].sendall(b"held")
        started = time.monotonic()
        proxy.close()
        assert time.monotonic() - started < 1
        assert all(receive(client, 1) == b"" for client in clients)
        with pytest.raises(ConnectionRefusedError):
            connect(proxy.address)
        with pytest.raises(RuntimeError, match="closed"):
            proxy.pass_()


def test_a_proxy_listens_only_on_loopback_or_a_namespace_address(echo: tuple[str, int]) -> None:
    with pytest.raises(ValueError, match="neither loopback"):
        FaultProxy(echo, host="0.0.0.0")


def postgres_answers(namespace: NetNamespace, host: str, port: int) -> bool:
    """Whether PostgreSQL answers at host:port from inside ``namespace``: a query by psql,
    or where there is none, the SSLRequest handshake."""
    if shutil.which("psql"):
        parts = urlsplit(POSTGRES_ADMIN_DSN)
        user = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        dsn = parts._replace(netloc=f"{user}{host}:{port}", query="connect_timeout=2").geturl()
        argv = ["psql", dsn, "-Atc", "select 1"]
    else:
        argv = [sys.executable, "-c", SSL_REQUEST, host, str(port)]
    probe = namespace.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    output, _ = probe.communicate(timeout=10)
    return probe.returncode == 0 and (argv[0] != "psql" or output.strip() == b"1")


@pytest.mark.postgres
def test_a_namespace_reaches_postgresql_only_through_its_proxy_on_the_host_address(
    namespace: NetNamespace,
) -> None:
    if os.environ.get("REQCRYPT_SKIP_POSTGRES") == "1":
        pytest.skip("REQCRYPT_SKIP_POSTGRES=1")
    parts = urlsplit(POSTGRES_ADMIN_DSN)
    proxy = namespace.proxy_to_host(parts.port or 5432, parts.hostname or "127.0.0.1")
    assert not postgres_answers(namespace, "127.0.0.1", 5432)
    assert postgres_answers(namespace, namespace.host_address, proxy.port)
    proxy.cut()
    assert not postgres_answers(namespace, namespace.host_address, proxy.port)
    proxy.restore()
    assert postgres_answers(namespace, namespace.host_address, proxy.port)


def test_a_server_in_a_namespace_is_reachable_from_the_host_until_its_link_is_cut(
    namespace: NetNamespace,
) -> None:
    address = (namespace.address, INSIDE_PORT)
    namespace.run([sys.executable, "-c", ECHO_INSIDE, str(INSIDE_PORT)])
    wait_connectable(address)
    with connect(address) as before:
        assert round_trip(before, b"before") == b"before"
        namespace.cut()
        with pytest.raises(OSError, match="No route to host"):
            connect(address, 1)
        before.settimeout(0.3)
        before.sendall(b"held")
        with pytest.raises(TimeoutError):
            before.recv(16)
        namespace.restore()
        before.settimeout(5)
        assert receive(before, 4) == b"held"
    with connect(address) as after:
        assert round_trip(after, b"after") == b"after"


def fail_inside_a_namespace(
    made: list[NetNamespace], processes: list[subprocess.Popen[bytes]]
) -> None:
    with NetNamespace() as namespace:
        made.append(namespace)
        processes.append(namespace.run(["sleep", "30"]))
        namespace.proxy_to_host(5432)
        raise RuntimeError("the test failed")


def test_a_namespace_is_removed_with_its_processes_even_when_the_test_fails() -> None:
    available, reason = faults_available()
    if not available:
        pytest.skip(reason)
    made: list[NetNamespace] = []
    processes: list[subprocess.Popen[bytes]] = []
    with pytest.raises(RuntimeError, match="the test failed"):
        fail_inside_a_namespace(made, processes)
    [namespace] = made
    assert processes[0].returncode is not None
    assert namespace.name not in namespaces()
    link = subprocess.run(["ip", "link", "show", namespace.veth], capture_output=True, check=False)
    assert link.returncode != 0
    route = subprocess.run(
        ["ip", "route", "show", str(namespace.network)], capture_output=True, check=True
    )
    assert route.stdout == b""
    with pytest.raises(ValueError, match="neither loopback"):
        FaultProxy(("127.0.0.1", 5432), host=namespace.host_address)


def test_a_paused_process_or_group_is_always_continued() -> None:
    shell = "sleep 30 & exec sleep 30"
    process = subprocess.Popen(["sh", "-c", shell], start_new_session=True)
    try:
        child = wait_child(process.pid)
        with Pauser(process.pid):
            assert is_stopped(process.pid)
            assert not is_stopped(child)
        assert not is_stopped(process.pid)
        with Pauser(process.pid, group=True):
            assert is_stopped(process.pid)
            assert wait_until(lambda: is_stopped(child))
        assert not is_stopped(process.pid)
        assert wait_until(lambda: not is_stopped(child))
        pauser = Pauser(process.pid)
        pauser.paused_for(0.2)
        assert is_stopped(process.pid)
        assert wait_until(lambda: not is_stopped(process.pid))
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)


def wait_child(pid: int, seconds: float = 5) -> int:
    """The first child of ``pid`` once it has one."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    assert wait_until(lambda: children.read_text().split() != [], seconds)
    return int(children.read_text().split()[0])


def wait_until(condition: Callable[[], bool], seconds: float = 2) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False
