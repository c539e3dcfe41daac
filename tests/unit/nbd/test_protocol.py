"""NBD message packing and request checks, byte for byte, without any socket."""

from __future__ import annotations

import struct

import pytest

from app.nbd import protocol
from app.nbd.protocol import (
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

EXPORT = Export(
    name="vol",
    size=1 << 20,
    flags=protocol.transmission_flags(read_only=False, trim=False),
    minimum_block=1,
    preferred_block=512,
    maximum_block=1280 * 1024,
)


def header(command: int, offset: int = 0, length: int = 0, flags: int = 0) -> RequestHeader:
    return RequestHeader(flags, command, 0x1234, offset, length)


def test_greeting_is_nbdmagic_ihaveopt_and_fixed_newstyle_with_no_zeroes() -> None:
    assert protocol.server_greeting() == b"NBDMAGICIHAVEOPT\x00\x03"


def test_client_flags_outside_fixed_newstyle_and_no_zeroes_are_refused() -> None:
    assert protocol.parse_client_flags(b"\x00\x00\x00\x03") == 3
    with pytest.raises(ProtocolError):
        protocol.parse_client_flags(b"\x00\x00\x00\x04")


def test_option_header_needs_ihaveopt() -> None:
    assert protocol.parse_option_header(b"IHAVEOPT" + struct.pack(">II", 7, 10)) == (7, 10)
    with pytest.raises(ProtocolError):
        protocol.parse_option_header(b"IHAVEOPS" + struct.pack(">II", 7, 10))


def test_option_reply_layout() -> None:
    reply = protocol.option_reply(Option.GO, Reply.ACK)
    assert reply == struct.pack(">QIII", 0x3E889045565A9, 7, 1, 0)
    error = protocol.option_error(Option.LIST, Reply.ERR_INVALID, "no")
    assert error == struct.pack(">QIII", 0x3E889045565A9, 3, (1 << 31) + 3, 2) + b"no"


def test_info_request_parses_name_and_requested_types() -> None:
    data = struct.pack(">I", 3) + b"vol" + struct.pack(">HHH", 2, 3, 1)
    assert protocol.parse_info_request(data) == ("vol", [3, 1])


@pytest.mark.parametrize(
    "data",
    [
        b"\x00\x00",
        struct.pack(">I", 10) + b"vol" + struct.pack(">H", 0),
        struct.pack(">I", 3) + b"vol" + struct.pack(">HH", 2, 3),
    ],
)
def test_info_request_with_inconsistent_lengths_is_invalid(data: bytes) -> None:
    with pytest.raises(ValueError, match=r"\w"):
        protocol.parse_info_request(data)


def test_info_replies_give_export_and_block_sizes_then_ack() -> None:
    replies = protocol.info_replies(Option.GO, EXPORT, [])
    first = struct.pack(">QIII", 0x3E889045565A9, 7, 3, 12) + struct.pack(
        ">HQH", 0, 1 << 20, EXPORT.flags
    )
    second = struct.pack(">QIII", 0x3E889045565A9, 7, 3, 14) + struct.pack(
        ">HIII", 3, 1, 512, 1280 * 1024
    )
    ack = struct.pack(">QIII", 0x3E889045565A9, 7, 1, 0)
    assert replies == first + second + ack
    with_name = protocol.info_replies(Option.INFO, EXPORT, [1])
    assert struct.pack(">QIII", 0x3E889045565A9, 6, 3, 5) + b"\x00\x01vol" in with_name


def test_flags_advertise_flush_fua_zeroes_multi_conn_and_trim_only_when_allowed() -> None:
    flags = protocol.transmission_flags(read_only=False, trim=False)
    assert flags == (
        TransmissionFlag.HAS_FLAGS
        | TransmissionFlag.SEND_FLUSH
        | TransmissionFlag.SEND_FUA
        | TransmissionFlag.SEND_WRITE_ZEROES
        | TransmissionFlag.CAN_MULTI_CONN
    )
    assert protocol.transmission_flags(read_only=False, trim=True) & TransmissionFlag.SEND_TRIM
    assert protocol.transmission_flags(read_only=True, trim=False) & TransmissionFlag.READ_ONLY


def test_export_name_reply_pads_124_zeroes_unless_no_zeroes() -> None:
    assert len(protocol.export_name_reply(EXPORT, no_zeroes=False)) == 8 + 2 + 124
    assert protocol.export_name_reply(EXPORT, no_zeroes=True) == struct.pack(
        ">QH", 1 << 20, EXPORT.flags
    )


def test_request_round_trips_and_bad_magic_is_a_protocol_error() -> None:
    request = header(Command.WRITE, 4096, 512, CommandFlag.FUA)
    packed = protocol.pack_request(request)
    assert len(packed) == 28
    assert protocol.parse_request(b"xx" + packed, 2) == request
    with pytest.raises(ProtocolError):
        protocol.parse_request(b"\x00" + packed[1:])


@pytest.mark.parametrize(
    ("request_header", "expected"),
    [
        (header(Command.READ, 0, 4096), Errno.OK),
        (header(Command.READ, (1 << 20) - 1, 1), Errno.OK),
        (header(Command.READ, (1 << 20) - 1, 2), Errno.EINVAL),
        (header(Command.WRITE, 1 << 20, 1), Errno.ENOSPC),
        (header(Command.WRITE_ZEROES, 1 << 20, 512), Errno.EINVAL),
        (header(Command.WRITE_ZEROES, 0, 512, CommandFlag.NO_HOLE | CommandFlag.FUA), Errno.OK),
        (header(Command.WRITE, 0, 512, CommandFlag.NO_HOLE), Errno.EINVAL),
        (header(Command.READ, 0, 512, 1 << 3), Errno.EINVAL),
        (header(Command.READ, 0, 512, 1 << 15), Errno.EINVAL),
        (header(Command.READ, 0, protocol.MAX_PAYLOAD + 1), Errno.EINVAL),
        (header(Command.TRIM, 0, 512), Errno.EINVAL),
        (header(Command.FLUSH), Errno.OK),
        (header(Command.FLUSH, 0, 1), Errno.EINVAL),
        (header(5), Errno.EINVAL),
        (header(99), Errno.EINVAL),
    ],
)
def test_request_checks(request_header: RequestHeader, expected: Errno) -> None:
    error, message = protocol.check_request(request_header, EXPORT)
    assert error == expected
    assert bool(message) == (expected != Errno.OK)


def test_write_to_a_read_only_export_is_eperm() -> None:
    read_only = Export(
        "ro", 4096, protocol.transmission_flags(read_only=True, trim=False), 1, 512, 4096
    )
    assert protocol.check_request(header(Command.WRITE, 0, 512), read_only)[0] == Errno.EPERM
    assert protocol.check_request(header(Command.READ, 0, 512), read_only)[0] == Errno.OK


def test_reply_layouts() -> None:
    assert protocol.simple_reply(7, 5) == struct.pack(">IIQ", 0x67446698, 5, 7)
    assert protocol.read_chunk_header(7, 4096, 512) == struct.pack(
        ">IHHQIQ", 0x668E33EF, 1, 1, 7, 520, 4096
    )
    assert (
        protocol.error_chunk(7, 22, "bad")
        == struct.pack(">IHHQIIH", 0x668E33EF, 1, 0x8001, 7, 9, 22, 3) + b"bad"
    )
