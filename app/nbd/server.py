"""The NBD server: asyncio connections in front of the volumes, an adapter over ``app.io``.

Threading model. In transmission, every complete request waiting in the buffer
becomes one ``Io`` of one batch (``app.io.batch.submit``): its reads and
whole-block writes enter the volume's queue back to back, under one plug, so
request mode merges a client's queue depth as the kernel merges a plug; the
partial-block rule and the error vocabulary are the I/O layer's, as for HTTP. A
batch under BIG_BATCH of whole-block I/O on a volume that serves promptly (page
cache or memory, no paced model) is started on the event loop itself: admission
that would wait refuses instead, and a request left behind another thread's is
waited for on a worker. Any other batch is one job of the I/O executor. Small
requests run one batch at a time per connection (group commit; OVERLAPPED_JOBS on a
volume whose device waits on the network, so that one batch is on the device while
the other's replies go out), and a batch waits out the volume's plug window before
it starts, so the rest of a client's burst joins it. With a batch per socket read instead, fio's 4 KiB
sequential writes at iodepth 32 settled into either ~30 or ~2 requests per batch
from run to run; one batch at a time, into half the queue depth; with the window
before each batch, 18-23 on average. A client at a fixed queue depth answers each
reply with a new request, so its requests still settled into two alternating halves
of its depth (16 bios a request at iodepth 32). Hence requests that continue the last
batch's stream, while the volume's engine is busy (its model holds work past now, so
it could not start them sooner) and the client owes answers to replies it was sent,
wait for those answers, as long as the engine stays busy and at most ANTICIPATION plug
windows, and start as soon as the last one arrives: a sequential stream merges while
the device is busy, as in the kernel (25-31 bios a request in that fio run). Random
I/O or an idle engine get the plug window alone; answers that do not come in time
are not waited for again. Batches still run one at a time per connection, in arrival
order. Pending requests moving BIG_BATCH bytes or more start at once. Replies go out
as each batch completes, matched by handle.

Admission. Every request counts against its volume's cap on I/Os in flight
(``REQCRYPT_MAX_VOLUME_IOS``), shared with HTTP: a batch takes the slots that are
free, and what finds none stays pending until one frees.

Back-pressure. A worker never blocks on the socket: replies are queued on the
transport. When the transport's buffer passes its high-water mark (a slow
reader) or too many requests are in flight (REQCRYPT_NBD_MAX_IN_FLIGHT, and
their payload bytes REQCRYPT_NBD_MAX_IN_FLIGHT_BYTES), the connection stops
reading new requests, so a slow or vanished client costs memory bounded per
connection and never holds a volume's queue. During negotiation the same holds
for options, with a small high-water mark. A read's payload is taken from the
process-wide budget of bytes held for clients (``app.io.budget``) before its
buffer exists, waited for in arrival order when the budget is spent, and given
back as the transport drains its reply. Replies that wait in the transport's
buffer are watched: a client that takes none of them for
REQCRYPT_SEND_TIMEOUT_SECONDS is aborted, and what it held is freed.

Bounds. At most REQCRYPT_NBD_MAX_CONNECTIONS connections are open: past it a new
one is closed before its greeting, and the open ones are served as before. A
connection has no receive buffer of its own: the socket is read into the
server's one receive area, whose contents are parsed, copied or dropped before
``buffer_updated`` returns (the event loop runs one read at a time), so an idle
connection costs only its objects.

Lifecycle. A watchdog closes a connection cleanly (stop reading, answer what is
in flight, close) when its volume is removed, renamed or no longer exported.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeAlias, TypeVar, cast

from app.blk import mempool
from app.config import NbdSettings
from app.control import Control
from app.dm.volume import Volume
from app.errors import ReqcryptError
from app.io.admission import VolumeAdmission
from app.io.batch import submit
from app.io.budget import ByteBudget
from app.io.executor import IoExecutor
from app.io.ops import Io
from app.io.status import IoStatus, status_of
from app.nbd import protocol
from app.nbd.protocol import (
    COMMAND_NAMES,
    NBD_CMD_DISC,
    NBD_CMD_FLUSH,
    NBD_CMD_READ,
    NBD_CMD_WRITE,
    ClientFlag,
    Command,
    CommandFlag,
    Errno,
    Export,
    Option,
    ProtocolError,
    Reply,
    RequestHeader,
    TransmissionFlag,
)
from app.vocab import REQ_OP_READ, Op

log = logging.getLogger("reqcrypt.nbd")
T = TypeVar("T")

FUA = int(CommandFlag.FUA)

#: Pending requests moving this many bytes start a batch even while one runs: they are
#: too big to gain from merging, and a second batch runs on another core.
BIG_BATCH = 1 << 20
#: A request continuing the last batch's stream waits at most this many plug windows for
#: the client's answers to its replies while the engine is busy (``_schedule``).
ANTICIPATION = 20
#: Small batches a connection runs at once on a volume whose device waits on the network:
#: one is on the device while the other's replies go out and the next requests arrive.
OVERLAPPED_JOBS = 2
#: Replies queued for a client past which it stops being read (a few MiB-sized replies).
WRITE_BUFFER_HIGH = 8 << 20
#: The socket is read this much at a time (``get_buffer``), into the server's one area.
RECEIVE_SIZE = 256 << 10
#: A read during negotiation takes at most this much: options are small, and a client
#: sending them faster than it takes their replies leaves the rest in its socket.
HANDSHAKE_RECEIVE = 4 << 10
#: Option replies queued for a client past which its options stop being read.
HANDSHAKE_WRITE_HIGH = 64 << 10
#: How often a connection whose replies wait in the transport's buffer looks whether the
#: client took some (budget goes back as they leave; none for the send timeout aborts).
SEND_WATCH_INTERVAL = 0.05
#: Refused connections are logged at most once per this many seconds.
REFUSAL_LOG_INTERVAL = 10.0
#: A write payload from this size on is received straight into its own buffer.
DIRECT_PAYLOAD = 64 << 10
#: A client that has not finished option haggling by then is dropped.
NEGOTIATION_TIMEOUT = 30.0
WATCH_INTERVAL = 0.2


# ------------------------------------------------------------------- statistics


@dataclass(slots=True)
class ExportStats:
    """NBD requests per command, bytes moved and errors, for one volume (by uuid)."""

    requests: dict[str, int] = field(
        default_factory=lambda: {c.name.lower(): 0 for c in Command if c is not Command.DISC}
    )
    read_bytes: int = 0
    written_bytes: int = 0
    errors: int = 0
    batches: int = 0

    def snapshot(self) -> dict[str, Any]:
        return {
            "requests": dict(self.requests),
            "read_bytes": self.read_bytes,
            "written_bytes": self.written_bytes,
            "errors": self.errors,
            "batches": self.batches,
        }


# ---------------------------------------------------------------- the I/O side


OPS: dict[int, Op] = {
    Command.READ: Op.READ,
    Command.WRITE: Op.WRITE,
    Command.FLUSH: Op.FLUSH,
    Command.TRIM: Op.DISCARD,
    Command.WRITE_ZEROES: Op.WRITE_ZEROES,
}

ERRNO: dict[IoStatus, Errno] = {
    IoStatus.NOT_FOUND: Errno.EIO,
    IoStatus.CONFLICT: Errno.EIO,
    IoStatus.INVALID: Errno.EINVAL,
    IoStatus.MALFORMED_RANGE: Errno.EINVAL,
    IoStatus.OUT_OF_RANGE: Errno.EINVAL,
    IoStatus.PRECONDITION_FAILED: Errno.EIO,
    IoStatus.TOO_LARGE: Errno.EOVERFLOW,
    IoStatus.NO_SPACE: Errno.ENOSPC,
    IoStatus.TIMEOUT: Errno.EIO,
    IoStatus.IO_ERROR: Errno.EIO,
    IoStatus.AGAIN: Errno.EIO,
}
"""The error vocabulary (``app.io.status``) as the errors NBD allows; a client sees EIO
for whatever it cannot act on."""


Pending: TypeAlias = tuple[RequestHeader, memoryview | None]
"""An accepted request waiting for its batch: its header (for the reply) and a write's
payload (a tuple, not an object of a class: one is made per request)."""


def start_io(header: RequestHeader, payload: memoryview | None) -> Io:
    """The request as the neutral op; a read gets its page-aligned reply buffer, a write's
    payload (the connection's own copy, dropped once answered) may be encrypted in place."""
    command = header.command
    if command == NBD_CMD_READ:
        return Io(REQ_OP_READ, header.offset, header.length, mempool.page_aligned(header.length))
    fua = bool(header.flags & FUA) and command != NBD_CMD_FLUSH
    # Positional (error None): a keyword makes the class call build a dict.
    return Io(
        OPS[command], header.offset, header.length, payload, fua, None, command == NBD_CMD_WRITE
    )


# ------------------------------------------------------------------ the server


class NbdServer:
    """Serves every volume whose ``nbd_export`` is set, under its name."""

    def __init__(
        self,
        control: Control,
        executor: IoExecutor,
        admission: VolumeAdmission,
        settings: NbdSettings,
        *,
        budget: ByteBudget,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.control = control
        self.budget = budget
        self.executor = executor
        self.admission = admission
        self.max_in_flight = settings.nbd_max_in_flight
        self.max_in_flight_bytes = settings.nbd_max_in_flight_bytes
        self.max_connections = settings.nbd_max_connections
        self.send_timeout = settings.send_timeout_seconds
        self.host = settings.host
        self.requested_port = settings.nbd_port
        self.tls = tls
        self.connections: set[NbdConnection] = set()
        #: Connections closed at once because ``max_connections`` were open.
        self.refused = 0
        #: Connections aborted because their client took no reply for ``send_timeout``.
        self.send_timeouts = 0
        self._refusal_logged = -REFUSAL_LOG_INTERVAL
        #: The one area every connection's socket is read into (see the module's Bounds).
        self.receive = memoryview(bytearray(RECEIVE_SIZE))
        self.receive_handshake = self.receive[:HANDSHAKE_RECEIVE]
        self.stats: dict[str, ExportStats] = {}
        self._server: asyncio.Server | None = None
        self._watchdog: asyncio.Task[None] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: NbdConnection(self), self.host, self.requested_port
        )
        self._watchdog = loop.create_task(self._watch())

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.shutdown()
        deadline = time.monotonic() + 5
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for connection in list(self.connections):
            connection.abort()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            self._sweep()

    def _sweep(self) -> None:
        """Close the connections of volumes no longer exported, drop removed volumes'
        statistics (in a frame of its own: the watchdog's would keep the last connection)."""
        for connection in list(self.connections):
            volume = connection.volume
            if volume is not None and not self._still_exported(connection.name, volume):
                connection.shutdown()
        live = {volume.uuid for volume in self.control.volumes.values()}
        for uuid in [uuid for uuid in self.stats if uuid not in live]:
            del self.stats[uuid]

    def refuse(self, transport: asyncio.Transport) -> None:
        """A connection past ``max_connections``: closed before its greeting, with a log
        line at most every REFUSAL_LOG_INTERVAL seconds (a flood must not flood the log)."""
        transport.close()
        self.refused += 1
        now = time.monotonic()
        if now - self._refusal_logged >= REFUSAL_LOG_INTERVAL:
            self._refusal_logged = now
            log.warning(
                "NBD connection refused: %d open (REQCRYPT_NBD_MAX_CONNECTIONS); "
                "%d refused since start",
                len(self.connections),
                self.refused,
            )

    def _still_exported(self, name: str, volume: Volume) -> bool:
        return self.control.volumes.get(name) is volume and volume.nbd_export

    def export_names(self) -> list[str]:
        return sorted(name for name, volume in self.control.volumes.items() if volume.nbd_export)

    def lookup(self, name: str) -> tuple[Volume, Export] | None:
        volume = self.control.volumes.get(name)
        if volume is None or not volume.nbd_export or volume.live is None:
            return None
        limits = volume.limits
        # dm-crypt refuses discards unless every crypt line allows them.
        trim = all(params.allow_discards for params in volume.live.table.crypt_params())
        export = Export(
            name=name,
            size=volume.size,
            flags=int(protocol.transmission_flags(read_only=False, trim=trim)),
            minimum_block=1,
            preferred_block=limits.logical_block_size,
            maximum_block=limits.max_sectors * 512,
        )
        return volume, export

    def stats_of(self, volume: Volume) -> ExportStats:
        stats = self.stats.get(volume.uuid)
        if stats is None:
            stats = self.stats[volume.uuid] = ExportStats()
        return stats

    def connections_of(self, volume: Volume) -> list[dict[str, Any]]:
        return [
            connection.describe()
            for connection in sorted(self.connections, key=lambda c: c.connected_at)
            if connection.volume is volume
        ]


@dataclass(slots=True, eq=False)
class DirectWrite:
    """A big write's payload being received straight into its own buffer."""

    header: RequestHeader
    payload: memoryview
    filled: int


class NbdConnection(asyncio.BufferedProtocol):
    """One client: option haggling as a coroutine, then request parsing in ``buffer_updated``.

    The socket is read into ``get_buffer``'s buffer: the server's receive area (a
    HANDSHAKE_RECEIVE slice of it while negotiating), parsed where it is when ``buffer``
    holds nothing carried over (what is left of it joins ``buffer``), or, once a write of
    DIRECT_PAYLOAD bytes or more has its header parsed, the rest of that write's own
    payload buffer, so a big payload is copied once, by the kernel. The area is every
    connection's: nothing may keep a view of it past ``buffer_updated``.
    """

    def __init__(self, server: NbdServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self._receive = server.receive_handshake
        self._direct: DirectWrite | None = None
        self.peer = "?"
        self.connected_at = datetime.now(UTC)
        self.name = ""
        self.volume: Volume | None = None
        self.export: Export | None = None
        self.stats: ExportStats | None = None
        self.structured = False
        self.tls_active = False
        self.transmission = False
        self.in_flight = 0
        self.in_flight_bytes = 0
        self.jobs = 0
        self.pending: list[Pending] = []
        self.pending_bytes = 0
        self.pending_read_bytes = 0
        self.closing = False
        self.closed = False
        self._linger: asyncio.TimerHandle | None = None
        self._anticipating = False
        #: Replies sent that the client has not yet answered with a new request.
        self._answered = 0
        #: Where the last batch's last request ended: a request starting there continues it.
        self._stream_end = -1
        self._discard = 0
        self._waiter: asyncio.Future[None] | None = None
        self._reading_paused = False
        self._writing_paused = False
        self._negotiation: asyncio.Task[None] | None = None
        self._awaiting_slot = False
        #: Waits for budget for the pending reads (``_take_budget``); then ``_granted``
        #: holds (how many pending requests, the budget taken for them).
        self._budget_wait: asyncio.Task[None] | None = None
        self._granted: tuple[int, int] | None = None
        #: Budget of replies handed to the transport and still in its buffer.
        self._unsent = 0
        self._send_watch: asyncio.TimerHandle | None = None
        #: The transport's buffer as last seen: smaller next time means the client took some.
        self._send_level = 0
        self._progress_at = 0.0

    # ----------------------------------------------------------- asyncio hooks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        server = self.server
        if len(server.connections) >= server.max_connections:
            server.refuse(self.transport)
            return
        self.transport.set_write_buffer_limits(high=HANDSHAKE_WRITE_HIGH)
        peer = self.transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        server.connections.add(self)
        self._negotiation = asyncio.get_running_loop().create_task(self._negotiate())

    def get_buffer(self, sizehint: int) -> memoryview:
        direct = self._direct
        if direct is not None:
            return direct.payload[direct.filled :]
        return self._receive

    def buffer_updated(self, nbytes: int) -> None:
        direct = self._direct
        if direct is not None:
            direct.filled += nbytes
            if direct.filled < len(direct.payload):
                return
            self._direct = None
            self._accept(direct.header, direct.payload)
        elif self.transmission and not self.buffer:
            # Nothing carried over: parsed where the socket put it, only the rest is kept.
            self._parse(self._receive[:nbytes])
            self._schedule()
            return
        else:
            self.buffer += self._receive[:nbytes]
        if self.transmission:
            self._parse()
            self._schedule()
        elif self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def eof_received(self) -> bool | None:
        self._lost()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost()
        self.server.connections.discard(self)
        self._release()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._update_reading()
        if not self.transmission:
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_result(None)  # the next option may be read
        elif self.buffer:
            self._parse()
            self._schedule()

    def _lost(self) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionResetError("NBD client went away"))

    def _release(self) -> None:
        """The transport is gone: the budget and buffers held for the client go with it,
        though a batch in flight keeps this object until it completes (and then gives its
        own budget back), and so does a wait for budget (``_take_budget`` gives back what
        it is granted)."""
        if self._send_watch is not None:
            self._send_watch.cancel()
            self._send_watch = None
        held = self._unsent
        if self._granted is not None:
            held += self._granted[1]
            self._granted = None
        self._unsent = 0
        if held:
            self.server.budget.give(held)
        self.buffer = bytearray()
        self.pending = []
        self._direct = None

    # ------------------------------------------------------------ negotiation

    async def _read(self, size: int) -> bytes:
        """The next ``size`` bytes, once the replies queued past the high-water mark have
        been taken: a client that never reads them is read no further (the transport also
        stops reading), so an option flood cannot grow its replies without bound."""
        while len(self.buffer) < size or self._writing_paused:
            if self.closed:
                raise ConnectionResetError("NBD client went away")
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    def _send(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self._write([data], 0)

    def _write(self, parts: list[bytes | memoryview], taken: int) -> None:
        """Hand replies to the transport. Of ``taken`` (the budget of their payloads) and
        what was held before, only what its buffer still holds stays held; while it holds
        anything the send watch runs."""
        transport = self.transport
        assert transport is not None
        if self._send_watch is not None:
            self._progress(transport.get_write_buffer_size())
        transport.writelines(parts)
        size = transport.get_write_buffer_size()
        self._unsent += taken
        self._settle(size)
        if size:
            self._send_level = size
            if self._send_watch is None:
                loop = asyncio.get_running_loop()
                self._progress_at = loop.time()
                self._send_watch = loop.call_later(SEND_WATCH_INTERVAL, self._watch_send)

    def _settle(self, size: int) -> None:
        """Hold budget for no more than the ``size`` bytes the transport still buffers."""
        if self._unsent > size:
            self.server.budget.give(self._unsent - size)
            self._unsent = size

    def _progress(self, size: int) -> None:
        """Nothing but the client's reading shrinks the transport's buffer between two looks."""
        if size < self._send_level:
            self._progress_at = asyncio.get_running_loop().time()

    def _watch_send(self) -> None:
        """Give back the budget of replies the client took; abort a client that took none
        for the send timeout (a reply left unread holds its memory, and its budget)."""
        self._send_watch = None
        transport = self.transport
        assert transport is not None
        size = transport.get_write_buffer_size()
        self._settle(size)
        if not size:
            return
        self._progress(size)
        loop = asyncio.get_running_loop()
        if loop.time() - self._progress_at >= self.server.send_timeout:
            self.server.send_timeouts += 1
            log.info(
                "NBD client %s took none of its %d bytes of replies for %gs "
                "(REQCRYPT_SEND_TIMEOUT_SECONDS): aborted",
                self.peer,
                size,
                self.server.send_timeout,
            )
            self.abort()
            return
        self._send_level = size
        self._send_watch = loop.call_later(SEND_WATCH_INTERVAL, self._watch_send)

    async def _negotiate(self) -> None:
        try:
            async with asyncio.timeout(NEGOTIATION_TIMEOUT):
                await self._haggle()
        except (ProtocolError, UnicodeDecodeError) as error:
            log.info("NBD client %s broke the protocol: %s", self.peer, error)
            self.abort()
        except (ConnectionError, TimeoutError, ssl.SSLError, asyncio.IncompleteReadError):
            self.abort()

    async def _haggle(self) -> None:
        self._send(protocol.server_greeting())
        client_flags = protocol.parse_client_flags(await self._read(4))
        if not client_flags & ClientFlag.C_FIXED_NEWSTYLE:
            raise ProtocolError("the client does not speak fixed newstyle")
        no_zeroes = bool(client_flags & ClientFlag.C_NO_ZEROES)
        require_tls = self.server.tls is not None
        while True:
            option, length = protocol.parse_option_header(await self._read(16))
            if length > protocol.MAX_OPTION_LENGTH:
                raise ProtocolError(f"option {option} of {length} bytes")
            data = await self._read(length)
            if option == Option.ABORT:
                self._send(protocol.option_reply(option, Reply.ACK))
                self.shutdown()
                return
            if require_tls and not self.tls_active and option != Option.STARTTLS:
                if option == Option.EXPORT_NAME:
                    raise ProtocolError("NBD_OPT_EXPORT_NAME before TLS")
                self._send(protocol.option_error(option, Reply.ERR_TLS_REQD, "start TLS first"))
                continue
            if option == Option.EXPORT_NAME:
                found = self.server.lookup(data.decode("utf-8"))
                if found is None:
                    raise ProtocolError("NBD_OPT_EXPORT_NAME names no exported volume")
                self._send(protocol.export_name_reply(found[1], no_zeroes=no_zeroes))
                self._enter_transmission(*found)
                return
            if option in (Option.INFO, Option.GO):
                if self._info(option, data) and option == Option.GO:
                    return
            elif option == Option.LIST:
                if data:
                    self._send(protocol.option_error(option, Reply.ERR_INVALID, "LIST has no data"))
                else:
                    self._send(protocol.list_reply(self.server.export_names()))
            elif option == Option.STRUCTURED_REPLY:
                if data:
                    self._send(protocol.option_error(option, Reply.ERR_INVALID, "no data expected"))
                else:
                    self.structured = True
                    self._send(protocol.option_reply(option, Reply.ACK))
            elif option == Option.STARTTLS:
                await self._start_tls(option, data)
            else:
                self._send(
                    protocol.option_error(option, Reply.ERR_UNSUP, f"option {option} unsupported")
                )

    def _info(self, option: int, data: bytes) -> bool:
        """Answer NBD_OPT_INFO/GO; True when the export was found (GO then transmits)."""
        try:
            name, requested = protocol.parse_info_request(data)
        except (ValueError, UnicodeDecodeError) as error:
            self._send(protocol.option_error(option, Reply.ERR_INVALID, str(error)))
            return False
        found = self.server.lookup(name)
        if found is None:
            self._send(
                protocol.option_error(option, Reply.ERR_UNKNOWN, f"no exported volume {name!r}")
            )
            return False
        self._send(protocol.info_replies(option, found[1], requested))
        if option == Option.GO:
            self._enter_transmission(*found)
        return True

    async def _start_tls(self, option: int, data: bytes) -> None:
        context = self.server.tls
        if context is None:
            self._send(protocol.option_error(option, Reply.ERR_POLICY, "TLS is not configured"))
            return
        if self.tls_active or data:
            self._send(protocol.option_error(option, Reply.ERR_INVALID, "TLS is already on"))
            return
        if self.buffer:
            raise ProtocolError("data after NBD_OPT_STARTTLS before the TLS handshake")
        self._send(protocol.option_reply(option, Reply.ACK))
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        transport = await loop.start_tls(self.transport, self, context, server_side=True)
        if transport is None:
            raise ConnectionResetError("TLS handshake did not complete")
        self.transport = transport
        self.transport.set_write_buffer_limits(high=HANDSHAKE_WRITE_HIGH)
        self.tls_active = True

    def _enter_transmission(self, volume: Volume, export: Export) -> None:
        self.name = export.name
        self.volume = volume
        self.export = export
        self.stats = self.server.stats_of(volume)
        self.transmission = True
        self._receive = self.server.receive
        assert self.transport is not None
        self.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        if self.buffer:
            self._parse()
            self._schedule()

    # ----------------------------------------------------------- transmission

    def _parse(self, received: memoryview | None = None) -> None:
        """Take every complete request off the buffer, or off ``received`` (a read when the
        buffer is empty; its rest becomes the buffer), then submit what is pending."""
        data = memoryview(self.buffer) if received is None else received
        size = len(data)
        position = 0
        replies: list[bytes] = []
        export = self.export
        stats = self.stats
        assert export is not None
        assert stats is not None
        size_limit, writable = export.size, not export.flags & TransmissionFlag.READ_ONLY
        try:
            while (
                not self.closing
                and not self._writing_paused
                and self.in_flight < self.server.max_in_flight
                and self.in_flight_bytes < self.server.max_in_flight_bytes
            ):
                if self._discard:
                    dropped = min(self._discard, size - position)
                    position += dropped
                    self._discard -= dropped
                    if self._discard:
                        break
                    continue
                if size - position < protocol.REQUEST.size:
                    break
                header = protocol.parse_request(data, position)
                body = protocol.REQUEST.size
                if header.command == NBD_CMD_WRITE and header.length <= protocol.MAX_PAYLOAD:
                    have = size - position - body
                    if have < header.length:
                        if header.length >= DIRECT_PAYLOAD:
                            payload = mempool.page_aligned(header.length)
                            payload[:have] = data[position + body : size]
                            self._direct = DirectWrite(header, payload, have)
                            position = size
                        break
                    # A copy of its own: it is encrypted in place (``start_io``).
                    end = position + body + header.length
                    payload = memoryview(bytearray(data[position + body : end]))
                else:
                    payload = None
                position += body + (header.length if payload is not None else 0)
                if header.command == NBD_CMD_DISC:
                    self.shutdown()
                    break
                command = header.command
                # The common valid shape, checked inline; ``check_request`` names any fault.
                if (
                    header.flags
                    or not (command == NBD_CMD_READ or (command == NBD_CMD_WRITE and writable))
                    or header.length > protocol.MAX_PAYLOAD
                    or header.offset + header.length > size_limit
                ):
                    error, message = protocol.check_request(header, export)
                    if error:
                        if command == Command.WRITE and payload is None:
                            self._discard = header.length  # oversized: its payload is dropped
                        stats.errors += 1
                        replies.append(self._error_reply(header.handle, error, message))
                        continue
                self._queue(header, payload)
        except ProtocolError as error:
            log.info("NBD client %s broke the protocol: %s", self.peer, error)
            self.abort()
            return
        finally:
            if received is None:
                data.release()  # the buffer cannot be resized while it is viewed
        if received is None:
            del self.buffer[:position]
        elif position < size:
            self.buffer += received[position:]
        if replies:
            self._send(b"".join(replies))
        self._update_reading()

    def _queue(self, header: RequestHeader, payload: memoryview | None) -> None:
        self.pending.append((header, payload))
        self.in_flight += 1
        if self._answered:
            self._answered -= 1
        if header.command <= NBD_CMD_WRITE:
            self.in_flight_bytes += header.length
            self.pending_bytes += header.length
            if header.command == NBD_CMD_READ:
                self.pending_read_bytes += header.length

    def _accept(self, header: RequestHeader, payload: memoryview) -> None:
        """A directly received write is complete: checked and queued as ``_parse`` would."""
        assert self.export is not None
        assert self.stats is not None
        error, message = protocol.check_request(header, self.export)
        if error:
            self.stats.errors += 1
            self._send(self._error_reply(header.handle, error, message))
        else:
            self._queue(header, payload)

    def _schedule(self) -> None:
        """Submit the pending requests, after the plug window unless they are big.

        Small requests wait out the volume's plug window (request mode) before their
        batch starts, so that the rest of a client's burst, still on the wire, joins
        it. Requests that continue the stream of the last batch, while the client still
        owes answers to replies it was sent and the engine is busy, wait as long as the
        engine stays busy (at most ANTICIPATION plug windows) for those answers, and
        start as soon as the last one arrives: as in the kernel, a sequential stream
        merges while the device is busy, not in the connection's batch rhythm.
        """
        if not self.pending:
            return
        if self._linger is not None:
            if self._anticipating and not self._answered:
                self._linger.cancel()
                self._end_linger()
            return
        volume = self.volume
        assert volume is not None
        if self.pending_bytes < BIG_BATCH and not self.closing:
            if self.jobs and (self.jobs >= OVERLAPPED_JOBS or not volume.overlaps_batches()):
                return
            window = volume.queue.plug_window_us / 1e6
            if window and volume.dispatch_mode == "request":
                delay = window
                first = self.pending[0][0]
                if (
                    self._answered
                    and first.command <= Command.WRITE
                    and first.offset == self._stream_end
                ):
                    delay = max(window, min(volume.engine.busy_for(), window * ANTICIPATION))
                self._anticipating = delay > window
                loop = asyncio.get_running_loop()
                self._linger = loop.call_later(delay, self._end_linger)
                return
        self._submit()

    def _end_linger(self) -> None:
        self._linger = None
        if self._anticipating:
            self._anticipating = False
            self._answered = 0  # what did not come in time is not waited for again
        if not self.closed:
            self._submit()

    def _submit(self) -> None:
        """Take the budget for the pending reads' payloads (or wait for it, holding none),
        admit what the volume's cap allows of those requests (the rest wait for a slot,
        their budget given back) and submit them as one batch: small ones start here, on
        the loop, big ones run on a worker (``app.io.batch.submit``).

        A connection waits for one resource at a time, holding only what its batches in
        flight and its unread replies hold, which they give back without it: no cycle.
        """
        batch = self.pending
        volume = self.volume
        if not batch or self._awaiting_slot or self._budget_wait is not None or volume is None:
            return
        budget = self.server.budget
        if self._granted is not None:
            count, taken = self._granted
            self._granted = None
        else:
            count, taken = len(batch), 0
            reads = self.pending_read_bytes
            if reads:
                if self._unsent:
                    # uvloop sends at the end of the loop's pass: the last replies may be gone.
                    assert self.transport is not None
                    self._settle(self.transport.get_write_buffer_size())
                held = budget.held
                if not budget.try_take(reads):
                    loop = asyncio.get_running_loop()
                    self._budget_wait = loop.create_task(self._take_budget(count, reads))
                    return
                taken = budget.held - held
        admission = self.server.admission
        granted = admission.take(volume, count)
        if not granted:
            if taken:
                budget.give(taken)
            self._awaiting_slot = True
            admission.when_free(volume, self._slot_freed)
            return
        self.pending = batch[granted:]
        batch = batch[:granted]
        last = batch[-1][0]
        self._stream_end = last.offset + last.length
        moved, reads = self.pending_bytes, self.pending_read_bytes
        if self.pending:
            moved = sum(header.length for header, _ in batch if header.command <= Command.WRITE)
            reads = sum(header.length for header, _ in batch if header.command == NBD_CMD_READ)
            if taken > reads:
                budget.give(taken - reads)
                taken = reads
        self.pending_bytes -= moved
        self.pending_read_bytes -= reads
        self.jobs += 1
        ios = [start_io(header, payload) for header, payload in batch]
        job = submit(self.server.executor, volume, ios, inline=moved < BIG_BATCH)
        job.add_done_callback(self._completion(volume, batch, ios, taken))

    async def _take_budget(self, count: int, reads: int) -> None:
        """The budget spent: wait for it in arrival order (a block client cannot be told to
        retry) for the first ``count`` pending requests, then submit them."""
        size = await self.server.budget.wait_take(reads)
        self._budget_wait = None
        if self.closed:
            self.server.budget.give(size)
            return
        self._granted = (count, size)
        self._submit()

    def _slot_freed(self) -> None:
        self._awaiting_slot = False
        if self.transmission and not self.closed:
            self._schedule()

    def _completion(
        self, volume: Volume, batch: list[Pending], ios: list[Io], taken: int
    ) -> Callable[[asyncio.Future[Any]], None]:
        def done(job: asyncio.Future[Any]) -> None:
            self.server.admission.leave(volume, len(batch))
            failure = None if job.cancelled() else job.exception()
            parts: list[bytes | memoryview] = []
            stats = self.stats
            assert stats is not None
            stats.batches += 1
            counts = stats.requests
            structured = self.structured
            pack = protocol.SIMPLE_REPLY.pack
            magic = protocol.SIMPLE_REPLY_MAGIC
            payload = read_bytes = written_bytes = 0
            for (header, _), io in zip(batch, ios, strict=True):
                command = header.command
                counts[COMMAND_NAMES[command]] += 1
                if command <= NBD_CMD_WRITE:
                    payload += header.length
                error = failure
                if error is None:
                    error = io.error
                if error is not None:
                    stats.errors += 1
                    if not isinstance(error, ReqcryptError):
                        log.error("NBD %s failed", COMMAND_NAMES[command], exc_info=error)
                    detail = error.detail if isinstance(error, ReqcryptError) else "I/O error"
                    errno = ERRNO[status_of(error)]
                    parts.append(self._error_reply(header.handle, errno, detail))
                elif command == NBD_CMD_READ:
                    assert io.buffer is not None
                    read_bytes += header.length
                    if structured:
                        parts.append(
                            protocol.read_chunk_header(header.handle, header.offset, header.length)
                        )
                    else:
                        parts.append(pack(magic, 0, header.handle))
                    parts.append(io.buffer)
                else:
                    if command == NBD_CMD_WRITE:
                        written_bytes += header.length
                    parts.append(pack(magic, 0, header.handle))
            stats.read_bytes += read_bytes
            stats.written_bytes += written_bytes
            if not self.closed and self.transport is not None:
                self._write(parts, taken)
            elif taken:
                self.server.budget.give(taken)
            self.in_flight -= len(batch)
            self.in_flight_bytes -= payload
            self._answered += len(batch)
            self.jobs -= 1
            self._update_reading()
            if self.transmission and not self.closed:
                if not self._writing_paused:
                    self._parse()  # requests left waiting while the connection was at its bound
                self._schedule()

        return done

    def _error_reply(self, handle: int, error: int, message: str) -> bytes:
        if self.structured:
            return protocol.error_chunk(handle, error, message)
        return protocol.simple_reply(handle, error)

    # ------------------------------------------------------------ flow, close

    def _update_reading(self) -> None:
        transport = self.transport
        if transport is None or self.closed:
            return
        if self.closing:
            if self.in_flight == 0:
                transport.close()
            return
        pause = (
            self.in_flight >= self.server.max_in_flight
            or self.in_flight_bytes >= self.server.max_in_flight_bytes
            or self._writing_paused
        )
        if pause and not self._reading_paused:
            transport.pause_reading()
            self._reading_paused = True
        elif not pause and self._reading_paused:
            transport.resume_reading()
            self._reading_paused = False

    def shutdown(self) -> None:
        """Clean close: read no more requests, answer those in flight, then close."""
        if self.closing:
            return
        self.closing = True
        if self.transport is not None and not self.closed and not self._reading_paused:
            with contextlib.suppress(RuntimeError):
                self.transport.pause_reading()
            self._reading_paused = True
        self._update_reading()

    def abort(self) -> None:
        """Hard disconnect."""
        self.closing = True
        if self.transport is not None:
            self.transport.abort()

    def describe(self) -> dict[str, Any]:
        return {
            "peer": self.peer,
            "tls": self.tls_active,
            "structured_replies": self.structured,
            "in_flight": self.in_flight,
            "connected_at": self.connected_at,
        }


def make_tls_context(cert: str, key: str, ca: str) -> ssl.SSLContext:
    """TLS 1.2 or later, the server's certificate, and client certificates verified against ``ca``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    context.load_verify_locations(ca)
    context.verify_mode = ssl.CERT_REQUIRED
    return context
