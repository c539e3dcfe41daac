"""Fault injection for cluster tests: a TCP proxy that delays, drops or cuts traffic, network
namespaces joined to the host by a veth pair, and SIGSTOP pauses.

A node under test runs in a ``NetNamespace``; its PostgreSQL link goes through a
``FaultProxy`` on the namespace's host address, so one node's database can be partitioned
while its HTTP clients still reach it, and ``NetNamespace.cut`` partitions the node from
everyone. There is no netem here: every delay and drop is the proxy's own. ``FaultProxy``
and ``Pauser`` need no privileges; ``NetNamespace`` needs root (``faults_available`` says
whether this machine has what it takes).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import ipaddress
import os
import random
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Self

Mode = Literal["pass", "delay", "drop", "cut"]

CHUNK = 64 * 1024
BUFFER_LIMIT = 1 << 20
"""Bytes a proxy holds per direction of a connection before it stops reading that side:
a delay or a slow reader costs bounded memory, and the sender feels TCP backpressure."""
MAX_CONNECTIONS = 256
"""Connections a proxy keeps at once; more are reset on arrival."""
CONNECT_SECONDS = 5.0
TICK_SECONDS = 0.2
"""Longest a proxy's loop sleeps: it notices closing (and connect deadlines) this soon."""
CONTROL_SECONDS = 5.0
"""Longest a control call waits for the proxy's loop to have applied it."""
CLOSE_SECONDS = 5.0
LINGER_RESET = struct.pack("ii", 1, 0)
"""SO_LINGER on with a zero timeout: close() sends RST instead of FIN."""

LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
NAMESPACE_RANGE = ipaddress.ip_network("10.213.0.0/16")
"""Where namespaces take their /30 links: index N is 10.213.0.0 + 4N (16384 of them)."""
NAMESPACE_PREFIX = 30
NAMESPACE_BLOCKS = 1 << (NAMESPACE_PREFIX - NAMESPACE_RANGE.prefixlen)
CLAIM_ATTEMPTS = 64
FALLBACK_METRIC = "4000"
"""Metric of a namespace's ``unreachable`` route, under its link's own (metric 0): while
the link is down, traffic for it fails here instead of leaving by the default route."""
NAMESPACE_SIDE = "eth0"
IP_SECONDS = 10.0
KILL_SECONDS = 5.0
STOP_SECONDS = 2.0
MAX_PAUSE_SECONDS = 60.0

_namespace_addresses: set[str] = set()
"""Both addresses of every open NetNamespace: the only non-loopback hosts a proxy may bind."""


@dataclass(frozen=True)
class ProxyStats:
    accepted: int
    """Connections taken in (forwarded or held), since the proxy started."""
    refused: int
    """Connections reset on arrival: while cut, or beyond MAX_CONNECTIONS."""
    open: int
    bytes_up: int
    """Bytes forwarded from clients to the upstream."""
    bytes_down: int
    """Bytes forwarded from the upstream to clients."""


@dataclass(eq=False)
class _Pipe:
    """One direction of a connection: chunks read from one socket, held, sent to the other.
    An empty chunk stands for the source's EOF, forwarded as ``shutdown(SHUT_WR)``."""

    sink: socket.socket | None = None
    chunks: deque[tuple[float, bytes]] = field(default_factory=deque)
    """(arrival time, data): a chunk is due at arrival + the delay in force when checked,
    so changing the delay also moves the chunks already held."""
    buffered: int = 0
    offset: int = 0
    """Bytes of the first chunk already sent."""
    reading: bool = True
    done: bool = False
    blocked: bool = False

    def push(self, now: float, data: bytes) -> None:
        self.chunks.append((now, data))
        self.buffered += len(data)
        if not data:
            self.reading = False

    def wants_read(self) -> bool:
        return self.reading and self.buffered < BUFFER_LIMIT

    def drain(self, now: float, hold: float) -> tuple[int, float | None]:
        """Send the chunks held ``hold`` seconds, in order: (bytes sent, when the next one
        is due, if one waits). Socket errors other than a full buffer are the caller's."""
        sent = 0
        self.blocked = False
        while self.chunks and self.sink is not None:
            arrived, data = self.chunks[0]
            if arrived + hold > now:
                return sent, arrived + hold
            if not data:
                with contextlib.suppress(OSError):
                    self.sink.shutdown(socket.SHUT_WR)
                self.chunks.popleft()
                self.done = True
                break
            try:
                count = self.sink.send(memoryview(data)[self.offset :])
            except BlockingIOError:
                self.blocked = True
                break
            sent += count
            self.offset += count
            if self.offset < len(data):
                self.blocked = True
                break
            self.chunks.popleft()
            self.buffered -= len(data)
            self.offset = 0
        return sent, None


@dataclass(eq=False)
class _Connection:
    client: socket.socket
    upstream: socket.socket | None = None
    connected: bool = False
    deadline: float = 0.0
    up: _Pipe = field(default_factory=_Pipe)
    """Client to upstream."""
    down: _Pipe = field(default_factory=_Pipe)
    """Upstream to client."""


def _reset(sock: socket.socket) -> None:
    """Close with RST, so the peer sees ConnectionResetError rather than a clean EOF."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
    sock.close()


def _check_listen_host(host: str) -> None:
    """A proxy never listens beyond this machine: loopback, or a namespace's veth address."""
    if ipaddress.ip_address(host) in LOOPBACK or host in _namespace_addresses:
        return
    raise ValueError(f"{host} is neither loopback nor an address of an open NetNamespace")


class _Closing:
    """``with`` closes it, whatever the block raised."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class FaultProxy(_Closing):
    """A TCP proxy from ``host:port`` (port 0: any free one) to ``upstream``, whose traffic a
    test degrades on the fly: ``delay``, ``drop``, ``cut``, then ``restore``.

    One selector loop in a daemon thread does all the I/O, never blocking longer than
    TICK_SECONDS, so ``close`` joins it within a bounded time whatever the connections
    do. A control call returns once the loop has applied it: after ``drop()`` nothing more
    is forwarded, after ``cut()`` every connection has been reset.

    ``drop`` does not read: bytes wait in the kernel (and fill its buffers, blocking the
    sender, as in a partition) and flow again, intact, after ``restore``, as TCP would
    retransmit them once a partition heals. A connection accepted while dropping reaches
    the upstream only after ``restore``, and a peer closing meanwhile is noticed then too.
    """

    def __init__(self, upstream: tuple[str, int], host: str = "127.0.0.1", port: int = 0) -> None:
        _check_listen_host(host)
        family, _, _, _, address = socket.getaddrinfo(*upstream, type=socket.SOCK_STREAM)[0]
        self.upstream = upstream
        self._upstream_family = family
        self._upstream_address = address
        self._listener = socket.create_server((host, port), backlog=128)
        self._listener.setblocking(False)
        self.host: str = self._listener.getsockname()[0]
        self.port: int = self._listener.getsockname()[1]
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self._lock = threading.Condition()
        self._mode: Mode = "pass"
        self._delay = 0.0
        self._generation = 0
        self._applied = 0
        self._closing = False
        self._stopped = False
        self._failure: BaseException | None = None
        self._accepted = 0
        self._refused = 0
        self._bytes_up = 0
        self._bytes_down = 0
        self._connections: set[_Connection] = set()
        self._selector = selectors.DefaultSelector()
        self._watched: dict[socket.socket, int] = {}
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_read, selectors.EVENT_READ)
        self._thread = threading.Thread(
            target=self._run, name=f"FaultProxy {self.host}:{self.port}", daemon=True
        )
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def pass_(self) -> None:
        """Forward everything at once, including what a delay or a drop holds."""
        self._set("pass", 0.0)

    def restore(self) -> None:
        self.pass_()

    def delay(self, seconds: float) -> None:
        """Hold every chunk, both ways, ``seconds`` after it arrived before forwarding it."""
        if seconds < 0:
            raise ValueError(f"negative delay {seconds}")
        self._set("delay", seconds)

    def drop(self) -> None:
        """Black hole: connections stay open (new ones are accepted) and nothing moves."""
        self._set("drop", 0.0)

    def cut(self) -> None:
        """Reset every connection (RST), and reset each new one on arrival until restored."""
        self._set("cut", 0.0)

    def stats(self) -> ProxyStats:
        return ProxyStats(
            accepted=self._accepted,
            refused=self._refused,
            open=len(self._connections),
            bytes_up=self._bytes_up,
            bytes_down=self._bytes_down,
        )

    def close(self) -> None:
        """Stop the loop and close every socket (open connections see EOF); a failure of
        the loop is raised here, so a test does not pass on a broken proxy."""
        with self._lock:
            self._closing = True
            if not self._stopped:
                self._wake()
        self._thread.join(CLOSE_SECONDS)
        if self._thread.is_alive():
            raise RuntimeError(f"{self._thread.name} did not stop in {CLOSE_SECONDS} s")
        if self._failure is not None:
            raise RuntimeError(f"{self._thread.name} failed") from self._failure

    def _set(self, mode: Mode, delay: float) -> None:
        with self._lock:
            if self._stopped or self._closing:
                raise RuntimeError(f"{self._thread.name} is closed")
            self._mode, self._delay = mode, delay
            self._generation += 1
            generation = self._generation
            self._wake()
            applied = self._lock.wait_for(
                lambda: self._applied >= generation or self._stopped, CONTROL_SECONDS
            )
        if self._failure is not None:
            raise RuntimeError(f"{self._thread.name} failed") from self._failure
        if not applied or self._applied < generation:
            raise RuntimeError(f"{self._thread.name} did not apply {mode}")

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            self._wake_write.send(b"\0")

    def _run(self) -> None:
        try:
            while self._step():
                pass
        except BaseException as error:
            self._failure = error
        finally:
            with self._lock:
                self._stopped = True
                self._lock.notify_all()
            for connection in list(self._connections):
                self._close(connection)
            self._selector.close()
            self._listener.close()
            self._wake_read.close()
            self._wake_write.close()

    def _step(self) -> bool:
        """One turn of the loop: apply the latest control, forward what is due, wait for
        sockets (or the next due chunk), read and accept."""
        with self._lock:
            if self._closing:
                return False
            mode, delay, generation = self._mode, self._delay, self._generation
        now = time.monotonic()
        if generation != self._applied:
            self._apply(mode, now)
            with self._lock:
                self._applied = generation
                self._lock.notify_all()
        hold = delay if mode == "delay" else 0.0
        wake_at = now + TICK_SECONDS
        for connection in list(self._connections):
            if mode != "drop":
                due = self._forward(connection, now, hold)
                if due is not None:
                    wake_at = min(wake_at, due)
            if connection in self._connections:
                self._watch_connection(connection, mode)
        for key, events in self._selector.select(max(0.0, wake_at - time.monotonic())):
            self._handle(key, events, mode, time.monotonic())
        if mode != "drop":
            now = time.monotonic()
            for connection in list(self._connections):
                if not connection.connected and now > connection.deadline:
                    self._close(connection, reset=True)
        return True

    def _apply(self, mode: Mode, now: float) -> None:
        if mode == "cut":
            for connection in list(self._connections):
                self._close(connection, reset=True)
        elif mode != "drop":
            for connection in list(self._connections):
                if connection.upstream is None:
                    self._connect(connection, now)
                elif not connection.connected:
                    connection.deadline = now + CONNECT_SECONDS

    def _forward(self, connection: _Connection, now: float, hold: float) -> float | None:
        """Drain both pipes; when the next chunk is due. A dead peer resets the connection."""
        try:
            up, up_due = connection.up.drain(now, hold)
            down, down_due = connection.down.drain(now, hold)
        except OSError:
            self._close(connection, reset=True)
            return None
        self._bytes_up += up
        self._bytes_down += down
        if connection.up.done and connection.down.done:
            self._close(connection)
            return None
        dues = [due for due in (up_due, down_due) if due is not None]
        return min(dues, default=None)

    def _watch_connection(self, connection: _Connection, mode: Mode) -> None:
        client = upstream = 0
        if mode != "drop":
            if connection.up.wants_read():
                client |= selectors.EVENT_READ
            if connection.down.blocked:
                client |= selectors.EVENT_WRITE
            if not connection.connected or connection.up.blocked:
                upstream |= selectors.EVENT_WRITE
            if connection.connected and connection.down.wants_read():
                upstream |= selectors.EVENT_READ
        self._watch(connection.client, client, connection)
        if connection.upstream is not None:
            self._watch(connection.upstream, upstream, connection)

    def _watch(self, sock: socket.socket, events: int, connection: _Connection) -> None:
        current = self._watched.get(sock, 0)
        if events == current:
            return
        if not current:
            self._selector.register(sock, events, connection)
        elif not events:
            self._selector.unregister(sock)
        else:
            self._selector.modify(sock, events, connection)
        if events:
            self._watched[sock] = events
        else:
            del self._watched[sock]

    def _handle(self, key: selectors.SelectorKey, events: int, mode: Mode, now: float) -> None:
        if key.fileobj is self._wake_read:
            with contextlib.suppress(BlockingIOError):
                self._wake_read.recv(CHUNK)
            return
        if key.fileobj is self._listener:
            self._accept(mode, now)
            return
        connection: _Connection = key.data
        if connection not in self._connections:
            return
        try:
            if key.fileobj is connection.client:
                if events & selectors.EVENT_READ:
                    self._receive(connection.client, connection.up, now)
            elif not connection.connected:
                self._finish_connect(connection)
            elif connection.upstream is not None and events & selectors.EVENT_READ:
                self._receive(connection.upstream, connection.down, now)
        except OSError:
            self._close(connection, reset=True)

    def _receive(self, sock: socket.socket, pipe: _Pipe, now: float) -> None:
        try:
            data = sock.recv(CHUNK)
        except BlockingIOError:
            return
        pipe.push(now, data)

    def _accept(self, mode: Mode, now: float) -> None:
        for _ in range(MAX_CONNECTIONS):
            try:
                client, _ = self._listener.accept()
            except (BlockingIOError, ConnectionAbortedError):
                return
            if mode == "cut" or len(self._connections) >= MAX_CONNECTIONS:
                self._refused += 1
                _reset(client)
                continue
            self._accepted += 1
            client.setblocking(False)
            connection = _Connection(client)
            connection.down.sink = client
            self._connections.add(connection)
            if mode != "drop":
                self._connect(connection, now)

    def _connect(self, connection: _Connection, now: float) -> None:
        upstream = socket.socket(self._upstream_family, socket.SOCK_STREAM)
        upstream.setblocking(False)
        connection.upstream = upstream
        connection.deadline = now + CONNECT_SECONDS
        result = upstream.connect_ex(self._upstream_address)
        if result == 0:
            self._connected(connection)
        elif result != errno.EINPROGRESS:
            self._close(connection, reset=True)

    def _finish_connect(self, connection: _Connection) -> None:
        assert connection.upstream is not None
        if connection.upstream.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self._close(connection, reset=True)
        else:
            self._connected(connection)

    def _connected(self, connection: _Connection) -> None:
        """Only now is the upstream a sink: a connecting socket would refuse the bytes,
        and a shutdown() before it connects would lose the client's EOF."""
        connection.connected = True
        connection.up.sink = connection.upstream

    def _close(self, connection: _Connection, *, reset: bool = False) -> None:
        self._connections.discard(connection)
        for sock in (connection.client, connection.upstream):
            if sock is None:
                continue
            if self._watched.pop(sock, 0):
                self._selector.unregister(sock)
            if reset:
                _reset(sock)
            else:
                sock.close()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=IP_SECONDS, check=False
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def namespaces() -> list[str]:
    """Names of this machine's network namespaces (``ip netns list``)."""
    lines = _ip("netns", "list").stdout.splitlines()
    return [line.split()[0] for line in lines if line.strip()]


class NetNamespace(_Closing):
    """A network namespace ``rqc-N`` linked to the root namespace by a veth pair on the /30
    N of NAMESPACE_RANGE: ``host_address`` (root side, ``veth``) and ``address`` (inside,
    on eth0, with ``lo`` up and a default route via ``host_address``). Created by the
    constructor; ``close`` (or leaving the ``with``) kills what runs in it and deletes it.

    The name is claimed atomically (``ip netns add`` fails on an existing one), so xdist
    workers and leftovers of a killed run never share a namespace, a veth or a /30.
    """

    def __init__(self) -> None:
        self._processes: list[subprocess.Popen[Any]] = []
        self._proxies: list[FaultProxy] = []
        self._closed = False
        start = random.randrange(NAMESPACE_BLOCKS)
        for attempt in range(CLAIM_ATTEMPTS):
            index = (start + attempt) % NAMESPACE_BLOCKS
            if self._claim(index):
                return
        raise RuntimeError(f"no free namespace in {CLAIM_ATTEMPTS} tries from rqc-{start}")

    def _claim(self, index: int) -> bool:
        """Create namespace ``index`` if its name, veth and /30 are all free; False if taken."""
        base = NAMESPACE_RANGE.network_address + index * 4
        self.network = ipaddress.ip_network(f"{base}/{NAMESPACE_PREFIX}")
        self.host_address = str(base + 1)
        self.address = str(base + 2)
        self.name = f"rqc-{index}"
        self.veth = f"rqc-{index}h"
        if _ip("-4", "-o", "addr", "show", "to", str(self.network)).stdout.strip():
            return False
        added = _ip("netns", "add", self.name, check=False)
        if added.returncode != 0:
            if "File exists" in added.stderr:
                return False
            raise RuntimeError(f"ip netns add {self.name}: {added.stderr.strip()}")
        try:
            peer = ("peer", "name", NAMESPACE_SIDE, "netns", self.name)
            veth = _ip("link", "add", self.veth, "type", "veth", *peer, check=False)
            if "File exists" in veth.stderr:
                _ip("netns", "del", self.name, check=False)
                return False
            if veth.returncode != 0:
                raise RuntimeError(f"ip link add {self.veth} type veth: {veth.stderr.strip()}")
            _namespace_addresses.update((self.host_address, self.address))
            _ip("route", "add", "unreachable", str(self.network), "metric", FALLBACK_METRIC)
            _ip("addr", "add", f"{self.host_address}/{NAMESPACE_PREFIX}", "dev", self.veth)
            _ip("link", "set", self.veth, "up")
            inside = ("-n", self.name)
            _ip(*inside, "addr", "add", f"{self.address}/{NAMESPACE_PREFIX}", "dev", NAMESPACE_SIDE)
            _ip(*inside, "link", "set", "lo", "up")
            _ip(*inside, "link", "set", NAMESPACE_SIDE, "up")
            _ip(*inside, "route", "add", "default", "via", self.host_address)
        except BaseException:
            self.close()
            raise
        return True

    def run(self, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """``argv`` inside the namespace, in a session of its own so that ``close`` kills
        its whole process group."""
        process = subprocess.Popen(
            ["ip", "netns", "exec", self.name, *argv], start_new_session=True, **popen_kwargs
        )
        self._processes.append(process)
        return process

    def proxy_to_host(
        self, upstream_port: int, upstream_host: str = "127.0.0.1", port: int = 0
    ) -> FaultProxy:
        """A FaultProxy on ``host_address`` (reachable from inside) to a root-namespace
        service, e.g. PostgreSQL on 127.0.0.1:5432, which the namespace cannot reach
        otherwise; closed with the namespace."""
        proxy = FaultProxy((upstream_host, upstream_port), host=self.host_address, port=port)
        self._proxies.append(proxy)
        return proxy

    def cut(self) -> None:
        """Take the link down (root side). New connections from the root namespace fail at
        once (EHOSTUNREACH, by the fallback route); packets of established ones, and all
        from inside, are lost, so those stall until ``restore`` or their TCP timeouts."""
        _ip("link", "set", self.veth, "down")

    def restore(self) -> None:
        _ip("link", "set", self.veth, "up")

    def pids(self) -> list[int]:
        """Every process whose network namespace this is, started by ``run`` or not."""
        return [int(pid) for pid in _ip("netns", "pids", self.name).stdout.split()]

    def close(self) -> None:
        """Close its proxies, kill its processes, delete the veth pair, the fallback route
        and the namespace: each step is tried even if one before failed."""
        if self._closed:
            return
        self._closed = True
        errors: list[str] = []
        for proxy in self._proxies:
            try:
                proxy.close()
            except RuntimeError as error:
                errors.append(str(error))
        for process in self._processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
            try:
                process.wait(KILL_SECONDS)
            except subprocess.TimeoutExpired:
                errors.append(f"process {process.pid} outlived SIGKILL")
        try:
            strays = self.pids()
        except RuntimeError as error:
            errors.append(str(error))
            strays = []
        for pid in strays:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _ip("link", "del", self.veth, check=False)
        _ip(
            "route", "del", "unreachable", str(self.network), "metric", FALLBACK_METRIC, check=False
        )
        _ip("netns", "del", self.name, check=False)
        _namespace_addresses.difference_update((self.host_address, self.address))
        if self.name in namespaces():
            errors.append(f"namespace {self.name} is still there")
        if _ip("link", "show", self.veth, check=False).returncode == 0:
            errors.append(f"link {self.veth} is still there")
        if errors:
            raise RuntimeError("; ".join(errors))


@functools.cache
def faults_available() -> tuple[bool, str]:
    """Whether this machine can make a NetNamespace (root, iproute2, netns and veth
    support), found by making one; the reason why not, for ``pytest.skip``."""
    if os.geteuid() != 0:
        return False, f"network namespaces need root (euid {os.geteuid()})"
    if shutil.which("ip") is None:
        return False, "no `ip` (iproute2) on PATH"
    try:
        with NetNamespace() as namespace:
            probe = namespace.run(["true"], stderr=subprocess.PIPE)
            _, stderr = probe.communicate(timeout=IP_SECONDS)
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        return False, f"cannot make a network namespace with a veth pair: {error}"
    if probe.returncode != 0:
        return False, f"`ip netns exec` fails: {stderr.decode().strip()}"
    return True, ""


def is_stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped by a signal (state T in /proc); a gone process is not."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except FileNotFoundError:
        return False


class Pauser:
    """SIGSTOP and SIGCONT for a process, or its whole process group (``group=True``, with
    ``pid`` its leader): a node that stops answering without dying, like a long GC pause
    or a frozen VM, which no network fault imitates (its sockets stay open).

    As a context manager it pauses on entry and always continues on exit; ``paused_for``
    pauses and continues from a timer, whatever the test thread is doing meanwhile.
    """

    def __init__(self, pid: int, *, group: bool = False) -> None:
        self.pid = pid
        self.group = group
        self._timer: threading.Timer | None = None

    def __enter__(self) -> Self:
        self.pause()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.resume()

    def pause(self) -> None:
        """SIGSTOP, returning once the process shows stopped (delivery is asynchronous)."""
        self._signal(signal.SIGSTOP)
        deadline = time.monotonic() + STOP_SECONDS
        while not is_stopped(self.pid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"process {self.pid} did not stop in {STOP_SECONDS} s")
            time.sleep(0.005)

    def resume(self) -> None:
        """SIGCONT (a gone process needs none), cancelling a pending ``paused_for``."""
        self._cancel_timer()
        with contextlib.suppress(ProcessLookupError):
            self._signal(signal.SIGCONT)

    def paused_for(self, seconds: float) -> None:
        """Pause now and continue after ``seconds`` (at most MAX_PAUSE_SECONDS), returning
        at once so the test can watch the others meanwhile."""
        if not 0 < seconds <= MAX_PAUSE_SECONDS:
            raise ValueError(f"pause of {seconds} s is not within (0, {MAX_PAUSE_SECONDS}]")
        self._cancel_timer()
        self.pause()
        self._timer = threading.Timer(seconds, self.resume)
        self._timer.daemon = True
        self._timer.start()

    def _cancel_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
            if timer is not threading.current_thread():
                timer.join(STOP_SECONDS)

    def _signal(self, sig: signal.Signals) -> None:
        if self.group:
            os.killpg(self.pid, sig)
        else:
            os.kill(self.pid, sig)
