"""A raw NBD client for protocol tests: every byte on the wire is the test's choice."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
from dataclasses import dataclass

from app.nbd import protocol
from app.nbd.protocol import Command, Option, Reply, RequestHeader


@dataclass
class OptionReply:
    option: int
    reply: int
    data: bytes


@dataclass
class Answer:
    handle: int
    error: int
    data: bytes = b""
    message: str = ""


class RawClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.structured = False
        self.read_lengths: dict[int, int] = {}
        self.next_handle = 1

    @classmethod
    async def connect(cls, port: int, *, client_flags: int = 3) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = cls(reader, writer)
        greeting = await reader.readexactly(18)
        assert greeting == protocol.server_greeting()
        writer.write(struct.pack(">I", client_flags))
        return client

    @classmethod
    async def open(cls, port: int, name: str, *, structured: bool = True) -> RawClient:
        client = await cls.connect(port)
        if structured:
            (reply,) = await client.option(Option.STRUCTURED_REPLY)
            assert reply.reply == Reply.ACK
            client.structured = True
        replies = await client.option(Option.GO, client.info_data(name))
        assert replies[-1].reply == Reply.ACK, replies
        return client

    @staticmethod
    def info_data(name: str, *requested: int) -> bytes:
        encoded = name.encode()
        return (
            struct.pack(">I", len(encoded))
            + encoded
            + struct.pack(f">H{len(requested)}H", len(requested), *requested)
        )

    def send_option(self, option: int, data: bytes = b"") -> None:
        self.writer.write(struct.pack(">QII", protocol.IHAVEOPT, option, len(data)) + data)

    async def option_reply(self) -> OptionReply:
        magic, option, reply, length = struct.unpack(">QIII", await self.reader.readexactly(20))
        assert magic == protocol.OPTION_REPLY_MAGIC
        return OptionReply(option, reply, await self.reader.readexactly(length))

    async def option(self, option: int, data: bytes = b"") -> list[OptionReply]:
        """Send an option and collect its replies up to the final one (ACK or an error)."""
        self.send_option(option, data)
        replies = []
        while True:
            reply = await self.option_reply()
            assert reply.option == option
            replies.append(reply)
            if reply.reply not in (Reply.INFO, Reply.SERVER):
                return replies

    async def start_tls(self, context: ssl.SSLContext) -> None:
        (reply,) = await self.option(Option.STARTTLS)
        assert reply.reply == Reply.ACK, reply
        await self.writer.start_tls(context, server_hostname="localhost")

    def send(
        self,
        command: int,
        offset: int = 0,
        length: int = 0,
        payload: bytes = b"",
        flags: int = 0,
        handle: int | None = None,
    ) -> int:
        if handle is None:
            handle = self.next_handle
            self.next_handle += 1
        if command == Command.READ:
            self.read_lengths[handle] = length
        header = RequestHeader(flags, command, handle, offset, length)
        self.writer.write(protocol.pack_request(header) + payload)
        return handle

    async def answer(self) -> Answer:
        (magic,) = struct.unpack(">I", await self.reader.readexactly(4))
        if magic == protocol.SIMPLE_REPLY_MAGIC:
            error, handle = struct.unpack(">IQ", await self.reader.readexactly(12))
            length = self.read_lengths.pop(handle, 0)
            data = await self.reader.readexactly(length) if length and not error else b""
            return Answer(handle, error, data)
        assert magic == protocol.STRUCTURED_REPLY_MAGIC, hex(magic)
        flags, kind, handle, length = struct.unpack(">HHQI", await self.reader.readexactly(16))
        assert flags & protocol.REPLY_FLAG_DONE
        payload = await self.reader.readexactly(length)
        self.read_lengths.pop(handle, None)
        if kind == protocol.ChunkType.OFFSET_DATA:
            return Answer(handle, 0, payload[8:])
        if kind == protocol.ChunkType.ERROR:
            error, size = struct.unpack(">IH", payload[:6])
            return Answer(handle, error, b"", payload[6 : 6 + size].decode())
        assert kind == protocol.ChunkType.NONE
        return Answer(handle, 0)

    async def request(self, command: int, offset: int = 0, length: int = 0, **kw: object) -> Answer:
        handle = self.send(command, offset, length, **kw)  # type: ignore[arg-type]
        answer = await self.answer()
        assert answer.handle == handle
        return answer

    async def closed_by_server(self, timeout: float = 3.0) -> bool:
        """True when the server closed the connection (EOF) within ``timeout``; closes ours."""
        try:
            data = await asyncio.wait_for(self.reader.read(1 << 16), timeout)
        except (ConnectionError, asyncio.IncompleteReadError):
            data = b""
        await self.close()
        return data == b""

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await self.writer.wait_closed()
