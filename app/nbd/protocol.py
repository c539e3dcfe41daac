"""NBD wire format: constants, message packing and request checks. Pure, no I/O.

Fixed newstyle handshake only. Names follow the NBD project's doc/proto.md
(``NBD_OPT_GO`` is ``Option.GO`` here). All integers are big-endian.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum, IntFlag
from typing import NamedTuple

NBDMAGIC = 0x4E42444D41474943
IHAVEOPT = 0x49484156454F5054
OPTION_REPLY_MAGIC = 0x3E889045565A9
REQUEST_MAGIC = 0x25609513
SIMPLE_REPLY_MAGIC = 0x67446698
STRUCTURED_REPLY_MAGIC = 0x668E33EF

#: What every server must accept in one READ or WRITE, whatever block size it advertises.
MAX_PAYLOAD = 32 << 20
#: Longest option the server reads: a name (4096 bytes at most) plus a few fields.
MAX_OPTION_LENGTH = 8192
MAX_STRING = 4096

OPTION_HEADER = struct.Struct(">QII")
OPTION_REPLY = struct.Struct(">QIII")
REQUEST = struct.Struct(">IHHQQI")
SIMPLE_REPLY = struct.Struct(">IIQ")
CHUNK = struct.Struct(">IHHQI")
U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")


class HandshakeFlag(IntFlag):
    FIXED_NEWSTYLE = 1 << 0
    NO_ZEROES = 1 << 1


class ClientFlag(IntFlag):
    C_FIXED_NEWSTYLE = 1 << 0
    C_NO_ZEROES = 1 << 1


class TransmissionFlag(IntFlag):
    HAS_FLAGS = 1 << 0
    READ_ONLY = 1 << 1
    SEND_FLUSH = 1 << 2
    SEND_FUA = 1 << 3
    ROTATIONAL = 1 << 4
    SEND_TRIM = 1 << 5
    SEND_WRITE_ZEROES = 1 << 6
    SEND_DF = 1 << 7
    CAN_MULTI_CONN = 1 << 8


class Option(IntEnum):
    EXPORT_NAME = 1
    ABORT = 2
    LIST = 3
    STARTTLS = 5
    INFO = 6
    GO = 7
    STRUCTURED_REPLY = 8


class Reply(IntEnum):
    ACK = 1
    SERVER = 2
    INFO = 3
    ERR_UNSUP = (1 << 31) + 1
    ERR_POLICY = (1 << 31) + 2
    ERR_INVALID = (1 << 31) + 3
    ERR_TLS_REQD = (1 << 31) + 5
    ERR_UNKNOWN = (1 << 31) + 6
    ERR_SHUTDOWN = (1 << 31) + 7


class Info(IntEnum):
    EXPORT = 0
    NAME = 1
    DESCRIPTION = 2
    BLOCK_SIZE = 3


class Command(IntEnum):
    READ = 0
    WRITE = 1
    DISC = 2
    FLUSH = 3
    TRIM = 4
    WRITE_ZEROES = 6


# Plain ints for per-request code (``Command.READ`` is an ``EnumType.__getattr__`` lookup).
NBD_CMD_READ, NBD_CMD_WRITE, NBD_CMD_DISC = int(Command.READ), int(Command.WRITE), int(Command.DISC)
NBD_CMD_FLUSH, NBD_CMD_TRIM = int(Command.FLUSH), int(Command.TRIM)


class CommandFlag(IntFlag):
    FUA = 1 << 0
    NO_HOLE = 1 << 1
    DF = 1 << 2


class ChunkType(IntEnum):
    NONE = 0
    OFFSET_DATA = 1
    ERROR = (1 << 15) + 1


REPLY_FLAG_DONE = 1


class Errno(IntEnum):
    """The error values the protocol allows (Linux errno numbers)."""

    OK = 0
    EPERM = 1
    EIO = 5
    ENOMEM = 12
    EINVAL = 22
    ENOSPC = 28
    EOVERFLOW = 75
    ESHUTDOWN = 108


#: Command flags each command accepts (FUA on every command, as the spec requires).
ALLOWED_FLAGS: dict[Command, CommandFlag] = {
    Command.READ: CommandFlag.FUA,
    Command.WRITE: CommandFlag.FUA,
    Command.FLUSH: CommandFlag.FUA,
    Command.TRIM: CommandFlag.FUA,
    Command.WRITE_ZEROES: CommandFlag.FUA | CommandFlag.NO_HOLE,
    Command.DISC: CommandFlag(0),
}


#: The checks on every request use plain ints: IntFlag arithmetic costs a microsecond a step.
_ALLOWED_FLAGS = {int(command): int(flags) for command, flags in ALLOWED_FLAGS.items()}
_READ_ONLY = int(TransmissionFlag.READ_ONLY)
_SEND_TRIM = int(TransmissionFlag.SEND_TRIM)
COMMAND_NAMES = {int(command): command.name.lower() for command in Command}


class ProtocolError(Exception):
    """The peer broke a MUST of the protocol: the session ends with a hard disconnect."""


@dataclass(frozen=True, slots=True)
class Export:
    """What the handshake tells a client about one export."""

    name: str
    size: int
    flags: int
    minimum_block: int
    preferred_block: int
    maximum_block: int


def transmission_flags(*, read_only: bool, trim: bool) -> TransmissionFlag:
    """Flush is per volume (one queue, one fsync), so every connection sees it: multi-conn holds."""
    flags = (
        TransmissionFlag.HAS_FLAGS
        | TransmissionFlag.SEND_FLUSH
        | TransmissionFlag.SEND_FUA
        | TransmissionFlag.SEND_WRITE_ZEROES
        | TransmissionFlag.CAN_MULTI_CONN
    )
    if trim:
        flags |= TransmissionFlag.SEND_TRIM
    if read_only:
        flags |= TransmissionFlag.READ_ONLY
    return flags


# ------------------------------------------------------------------ handshake


def server_greeting() -> bytes:
    flags = HandshakeFlag.FIXED_NEWSTYLE | HandshakeFlag.NO_ZEROES
    return struct.pack(">QQH", NBDMAGIC, IHAVEOPT, flags)


def parse_client_flags(data: bytes) -> ClientFlag:
    (value,) = U32.unpack(data)
    if value & ~int(ClientFlag.C_FIXED_NEWSTYLE | ClientFlag.C_NO_ZEROES):
        raise ProtocolError(f"unknown client flags {value:#x}")
    return ClientFlag(value)


def parse_option_header(data: bytes) -> tuple[int, int]:
    """(option, length of its data); the option may be one this server does not know."""
    magic, option, length = OPTION_HEADER.unpack(data)
    if magic != IHAVEOPT:
        raise ProtocolError(f"bad option magic {magic:#x}")
    return option, length


def option_reply(option: int, reply: Reply, data: bytes = b"") -> bytes:
    return OPTION_REPLY.pack(OPTION_REPLY_MAGIC, option, reply, len(data)) + data


def option_error(option: int, reply: Reply, message: str) -> bytes:
    return option_reply(option, reply, message.encode()[:MAX_STRING])


def parse_info_request(data: bytes) -> tuple[str, list[int]]:
    """NBD_OPT_INFO / NBD_OPT_GO data: (export name, requested information types).

    Raises ValueError when the lengths do not add up (answered NBD_REP_ERR_INVALID).
    """
    if len(data) < 6:
        raise ValueError("option data too short")
    (name_length,) = U32.unpack_from(data)
    if name_length > MAX_STRING or 4 + name_length + 2 > len(data):
        raise ValueError("export name length does not fit the option")
    name = data[4 : 4 + name_length].decode("utf-8", errors="strict")
    (count,) = U16.unpack_from(data, 4 + name_length)
    rest = data[4 + name_length + 2 :]
    if len(rest) != 2 * count:
        raise ValueError("information request count does not match the option length")
    return name, [U16.unpack_from(rest, 2 * i)[0] for i in range(count)]


def info_replies(option: int, export: Export, requested: list[int]) -> bytes:
    """NBD_REP_INFO for the export (always), its block sizes (always: min 1 is a promise
    clients may use) and its name when asked, then NBD_REP_ACK."""
    parts = [
        option_reply(
            option, Reply.INFO, struct.pack(">HQH", Info.EXPORT, export.size, export.flags)
        ),
        option_reply(
            option,
            Reply.INFO,
            struct.pack(
                ">HIII",
                Info.BLOCK_SIZE,
                export.minimum_block,
                export.preferred_block,
                export.maximum_block,
            ),
        ),
    ]
    if Info.NAME in requested:
        parts.append(option_reply(option, Reply.INFO, U16.pack(Info.NAME) + export.name.encode()))
    parts.append(option_reply(option, Reply.ACK))
    return b"".join(parts)


def list_reply(names: list[str]) -> bytes:
    parts = [
        option_reply(Option.LIST, Reply.SERVER, U32.pack(len(encoded)) + encoded)
        for encoded in (name.encode() for name in names)
    ]
    parts.append(option_reply(Option.LIST, Reply.ACK))
    return b"".join(parts)


def export_name_reply(export: Export, *, no_zeroes: bool) -> bytes:
    return struct.pack(">QH", export.size, export.flags) + (b"" if no_zeroes else bytes(124))


# --------------------------------------------------------------- transmission


class RequestHeader(NamedTuple):
    """A request's fixed part (a tuple: one is built per request on the hot path)."""

    flags: int
    command: int
    handle: int
    offset: int
    length: int


#: The tuple constructor itself: a named tuple's own ``__new__`` is a Python function.
_new_header = tuple.__new__


def parse_request(data: bytes | bytearray | memoryview, offset: int = 0) -> RequestHeader:
    fields = REQUEST.unpack_from(data, offset)
    if fields[0] != REQUEST_MAGIC:
        raise ProtocolError(f"bad request magic {fields[0]:#x}")
    return _new_header(RequestHeader, fields[1:])


def pack_request(header: RequestHeader) -> bytes:
    """The client's side, for tests and tools."""
    return REQUEST.pack(
        REQUEST_MAGIC, header.flags, header.command, header.handle, header.offset, header.length
    )


_ACCEPTED = (Errno.OK, "")


def check_request(header: RequestHeader, export: Export) -> tuple[Errno, str]:
    """The error a request gets before any I/O (Errno.OK: none), with a message.

    Unknown commands and flags: EINVAL. Past the end: ENOSPC for writes, EINVAL
    otherwise, as the spec's error values say. READ/WRITE over MAX_PAYLOAD: EINVAL
    (the server reads and drops an oversized write's payload first).
    """
    command = header.command
    allowed = _ALLOWED_FLAGS.get(command)
    if allowed is None:
        return Errno.EINVAL, f"unknown command {command}"
    if header.flags & ~allowed:
        return Errno.EINVAL, f"flags {header.flags:#x} are not valid for {COMMAND_NAMES[command]}"
    if command in (NBD_CMD_FLUSH, NBD_CMD_DISC):
        if header.offset or header.length:
            return Errno.EINVAL, f"{COMMAND_NAMES[command]} carries no offset or length"
        return _ACCEPTED
    if command != NBD_CMD_READ and export.flags & _READ_ONLY:
        return Errno.EPERM, "the export is read-only"
    if command == NBD_CMD_TRIM and not export.flags & _SEND_TRIM:
        return Errno.EINVAL, "trim needs the allow_discards crypt option"
    if command <= NBD_CMD_WRITE and header.length > MAX_PAYLOAD:
        return Errno.EINVAL, f"{header.length} bytes exceed the {MAX_PAYLOAD}-byte maximum"
    if header.offset + header.length > export.size:
        error = Errno.ENOSPC if command == NBD_CMD_WRITE else Errno.EINVAL
        return error, f"range {header.offset}+{header.length} is past the end ({export.size})"
    return _ACCEPTED


def simple_reply(handle: int, error: int = 0) -> bytes:
    return SIMPLE_REPLY.pack(SIMPLE_REPLY_MAGIC, error, handle)


_DATA_CHUNK = struct.Struct(">IHHQIQ")
"""A chunk header and the offset of its data: one pack per read reply."""
_OFFSET_DATA = int(ChunkType.OFFSET_DATA)


def read_chunk_header(handle: int, offset: int, length: int) -> bytes:
    """NBD_REPLY_TYPE_OFFSET_DATA, final: the header and offset before ``length`` data bytes."""
    return _DATA_CHUNK.pack(
        STRUCTURED_REPLY_MAGIC, REPLY_FLAG_DONE, _OFFSET_DATA, handle, 8 + length, offset
    )


def error_chunk(handle: int, error: int, message: str) -> bytes:
    text = message.encode()[:1024]
    payload = U32.pack(error) + U16.pack(len(text)) + text
    return (
        CHUNK.pack(STRUCTURED_REPLY_MAGIC, REPLY_FLAG_DONE, ChunkType.ERROR, handle, len(payload))
        + payload
    )
