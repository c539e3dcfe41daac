"""The data path: ranged reads and writes, flush, discard, write-zeroes.

An adapter over ``app.io``: each request becomes ``Io``s of one batch, run off
the event loop; the partial-block rule, admission and error vocabulary are the
I/O layer's, as for NBD. Bodies stream in and out in chunks of
``io_chunk_bytes``. No SQL and no pydantic on payloads here.

Every buffer larger than a slab piece (``mempool.SLAB_PIECE``) is taken from the byte
budget (``app.io.budget``) before it is allocated: a new request that finds it spent is
answered 503, a stream under way waits for room; an answer's buffer is given back only
once the connection has let go of it.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import secrets
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import TypeVar

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from starlette.exceptions import HTTPException

from app.api.deadline import BodyReader
from app.api.deps import BEARER_SECURITY, IoContext, IoDep
from app.api.multipart import multipart_boundary, parse_byteranges_body
from app.api.problems import responses
from app.api.ranges import ByteRange, content_length, parse_content_range, parse_range
from app.api.schemas import RangeIn
from app.blk import mempool
from app.dm.generation import Precondition
from app.dm.volume import Volume
from app.errors import (
    BatchFailed,
    InvalidRange,
    PayloadTooLarge,
    PreconditionFailed,
    ReqcryptError,
)
from app.io.batch import execute, run
from app.io.budget import ByteBudget
from app.io.ops import Io
from app.vocab import Op

T = TypeVar("T")

router = APIRouter(prefix="/v1/volumes/{name}", tags=["data"], responses=responses(401, 404))

OCTETS = "application/octet-stream"


def etag(volume: Volume, version: int | None = None) -> str:
    """A strong ETag: the volume and a version of its content (``Generation``)."""
    return f'"{volume.uuid}.{volume.generation if version is None else version}"'


LEASE_EPOCH = "Reqcrypt-Lease-Epoch"


def written(volume: Volume, version: int | None) -> dict[str, str]:
    """A write's answer headers: its ETag, and on a cluster node the lease epoch it was
    accepted under, so a client can tell a stale owner's acknowledgement from a newer one."""
    headers = {"ETag": etag(volume, version)}
    if volume.lease_epoch is not None:
        headers[LEASE_EPOCH] = str(volume.lease_epoch)
    return headers


def request_headers(request: Request) -> dict[bytes, bytes]:
    """The request's headers by (lower-case) name, the first of a repeated one as
    ``request.headers`` finds it: one dict, not a scan of the list per name and a KeyError
    per absent one."""
    return dict(reversed(request.scope["headers"]))


def header(headers: dict[bytes, bytes], name: bytes) -> str | None:
    value = headers.get(name)
    return None if value is None else value.decode("latin-1")


def if_match(headers: dict[bytes, bytes], volume: Volume) -> Precondition | None:
    """If-Match as a precondition the volume checks atomically with the write it guards."""
    tags = header(headers, b"if-match")
    if tags is None:
        return None
    return lambda version: _matches(tags, etag(volume, version))


def versioned(headers: dict[str, str], volume: Volume, version: int | None) -> dict[str, str]:
    """The ETag of the bytes actually read; none when writes kept overlapping the read."""
    headers.pop("ETag", None)
    if version is not None:
        headers["ETag"] = etag(volume, version)
    return headers


def _matches(header: str, tag: str) -> bool:
    candidates = [part.strip() for part in header.split(",")]
    return "*" in candidates or tag in candidates


def check_if_match(headers: dict[bytes, bytes], volume: Volume) -> None:
    tags = header(headers, b"if-match")
    if tags is not None and not _matches(tags, etag(volume)):
        raise PreconditionFailed(f"If-Match does not match the current ETag {etag(volume)}")


def read_preconditions(
    request: Request, volume: Volume, max_ranges: int
) -> tuple[dict[str, str] | None, list[ByteRange] | None]:
    """Shared by GET and HEAD: If-Match (412), If-None-Match (None: answer 304), If-Range
    (a stale validator drops the Range) and the satisfiable ranges (416 when none)."""
    headers = request_headers(request)
    check_if_match(headers, volume)
    tag = etag(volume)
    if_none = header(headers, b"if-none-match")
    if if_none is not None and _matches(if_none, tag):
        return None, None
    range_header = header(headers, b"range")
    if_range = header(headers, b"if-range")
    if range_header is not None and if_range is not None and if_range.strip() != tag:
        range_header = None
    ranges = parse_range(range_header, volume.size, max_ranges) if range_header else None
    return {"Accept-Ranges": "bytes", "ETag": tag}, ranges


def budgeted(size: int) -> bool:
    """Whether a buffer of ``size`` bytes counts against the byte budget: smaller ones
    are carved from a thread's slab, and bounded by the connection count."""
    return size > mempool.SLAB_PIECE


async def held_for_client(
    io: IoContext, length: int, work: Callable[..., T], *args: object, wait: bool
) -> T:
    """``work(*args)`` off the loop, where it allocates the ``length``-byte buffer it
    returns (or returns first, in a tuple), with those bytes taken from the byte budget
    first (``wait``: for room, else 503) and given back when the buffer is freed."""
    if not budgeted(length):
        return await io.executor.run(work, *args)
    budget = io.budget
    size = await budget.wait_take(length) if wait else budget.take(length, "an answer")
    try:
        result = await io.executor.run(work, *args)
    except BaseException:
        budget.give(size)
        raise
    buffer = result[0] if isinstance(result, tuple) else result
    assert isinstance(buffer, memoryview)
    budget.release_with(buffer.obj, size)
    return result


async def stream_range(
    io: IoContext, volume: Volume, first: int, length: int, chunk: int
) -> AsyncIterator[memoryview]:
    position, end = first, first + length
    while position < end:
        size = min(chunk, end - position)
        yield await held_for_client(io, size, _read, volume, position, size, wait=True)
        position += size


async def open_stream(
    io: IoContext, volume: Volume, first: int, length: int, chunk: int
) -> AsyncIterator[memoryview]:
    """``stream_range`` with its first chunk read before the response starts, so a volume
    that cannot be read (suspended too long, error target, no budget) gets a problem
    response, not a 200 cut short. A failure later in a long stream can only abort the
    connection."""
    size = min(chunk, length)
    head = await held_for_client(io, size, _read, volume, first, size, wait=False)

    async def chunks() -> AsyncIterator[memoryview]:
        yield head
        async for piece in stream_range(io, volume, first + size, length - size, chunk):
            yield piece

    return chunks()


def pieces(body: memoryview, size: int) -> Iterator[memoryview]:
    """A body held whole, handed to the connection a piece at a time: each waits until the
    connection has taken the last (its flow control), so an unread answer stays in this
    buffer, counted, rather than in a copy the transport makes."""
    for start in range(0, len(body), size):
        yield body[start : start + size]


def check_batch_bytes(total: int, limit: int) -> None:
    if total > limit:
        raise PayloadTooLarge(
            f"a batch of {total} bytes exceeds the {limit}-byte maximum (REQCRYPT_MAX_BATCH_BYTES)"
        )


@router.get(
    "/data",
    response_class=StreamingResponse,
    responses={
        200: {"content": {OCTETS: {}}, "description": "the whole volume"},
        206: {"content": {OCTETS: {}, "multipart/byteranges": {}}, "description": "ranges"},
        304: {"description": "If-None-Match matched"},
        **responses(400, 412, 413, 416, 503),
    },
    openapi_extra=BEARER_SECURITY,
)
async def read_data(name: str, request: Request, io: IoDep) -> Response:
    """Read with ``Range: bytes=a-b | a- | -N``.

    Several ranges (up to REQCRYPT_MAX_RANGES, 256 by default; more: 400) are one
    batch: all their bios enter the queue together, in one worker job, and the
    answer is multipart/byteranges. A batch holds at most REQCRYPT_MAX_BATCH_BYTES
    (64 MiB by default; more: 413). Honours If-Match (412), If-None-Match (304)
    and If-Range (full 200 when stale).
    """
    volume = io.control.volume(name)
    io.admission.enter(volume)
    try:
        response = await _read_response(volume, request, io)
    except BaseException:
        io.admission.leave(volume)
        raise
    if isinstance(response, StreamingResponse):
        response.body_iterator = io.admission.streamed(volume, response.body_iterator)
    else:
        io.admission.leave(volume)
    return response


async def _read_response(volume: Volume, request: Request, io: IoContext) -> Response:
    headers, ranges = read_preconditions(request, volume, io.limits.max_ranges)
    if headers is None:
        return Response(status_code=304, headers={"Accept-Ranges": "bytes", "ETag": etag(volume)})
    size = volume.size
    chunk = io.limits.io_chunk_bytes
    if ranges is None:
        headers["Content-Length"] = str(size)
        return StreamingResponse(
            await open_stream(io, volume, 0, size, chunk),
            media_type=OCTETS,
            headers=weak_etag(headers),
        )
    if len(ranges) == 1:
        (byte_range,) = ranges
        headers["Content-Range"] = byte_range.content_range(size)
        headers["Content-Length"] = str(byte_range.length)
        if byte_range.length <= chunk:
            data, version = await held_for_client(
                io,
                byte_range.length,
                _read_versioned,
                volume,
                byte_range.first,
                byte_range.length,
                wait=False,
            )
            return Response(
                data,
                status_code=206,
                media_type=OCTETS,
                headers=versioned(headers, volume, version),
            )
        return StreamingResponse(
            await open_stream(io, volume, byte_range.first, byte_range.length, chunk),
            status_code=206,
            media_type=OCTETS,
            headers=weak_etag(headers),
        )
    check_batch_bytes(sum(r.length for r in ranges), io.limits.max_batch_bytes)
    boundary = secrets.token_hex(12)
    heads, tail = _batch_delimiters(volume.size, ranges, boundary)
    length = sum(map(len, heads)) + sum(r.length for r in ranges) + len(tail)
    body, version = await held_for_client(
        io, length, _read_batch, volume, ranges, heads, tail, length, wait=False
    )
    headers["Content-Length"] = str(length)
    return StreamingResponse(
        pieces(body, chunk),
        status_code=206,
        media_type=f"multipart/byteranges; boundary={boundary}",
        headers=versioned(headers, volume, version),
    )


def weak_etag(headers: dict[str, str]) -> dict[str, str]:
    """A body streamed in several reads may span writes: its ETag can only be weak."""
    headers["ETag"] = "W/" + headers["ETag"]
    return headers


@router.head(
    "/data",
    responses={
        200: {"content": {OCTETS: {}}, "description": "headers of the whole volume"},
        206: {"content": {OCTETS: {}}, "description": "headers of one range"},
        304: {"description": "If-None-Match matched"},
        **responses(400, 412, 416),
    },
    openapi_extra=BEARER_SECURITY,
)
async def head_data(name: str, request: Request, io: IoDep) -> Response:
    """GET's headers without the body: size, ETag, and the Content-Range a Range would get."""
    volume = io.control.volume(name)
    headers, ranges = read_preconditions(request, volume, io.limits.max_ranges)
    if headers is None:
        return Response(status_code=304, headers={"Accept-Ranges": "bytes", "ETag": etag(volume)})
    size = volume.size
    headers["Content-Length"] = str(size)
    if ranges is not None and len(ranges) == 1:
        headers["Content-Range"] = ranges[0].content_range(size)
        headers["Content-Length"] = str(ranges[0].length)
        return Response(status_code=206, headers=headers, media_type=OCTETS)
    return Response(status_code=200, headers=headers, media_type=OCTETS)


@router.put(
    "/data",
    status_code=204,
    responses=responses(400, 408, 411, 412, 413, 416, 500, 503),
    openapi_extra={
        **BEARER_SECURITY,
        "requestBody": {
            "content": {
                OCTETS: {"schema": {"type": "string", "format": "binary"}},
                "multipart/byteranges": {"schema": {"type": "string", "format": "binary"}},
            }
        },
        "parameters": [
            {
                "name": "Content-Range",
                "in": "header",
                "required": False,
                "description": "required for an application/octet-stream body; "
                "each part carries its own in a multipart/byteranges body",
                "schema": {"type": "string", "example": "bytes 0-4095/*"},
            }
        ],
    },
)
async def write_data(name: str, request: Request, io: IoDep, fua: bool = False) -> Response:
    """Write ``Content-Range: bytes a-b/*``; any alignment (partial units are read-modify-written).

    The body must be exactly b-a+1 bytes (Content-Length required). ``?fua=true``
    returns only once the data is durable. Answers 204 with the new ETag.

    A batch: ``Content-Type: multipart/byteranges; boundary=…`` with one part per
    write, each with its own ``Content-Range`` (parts in any order; overlapping
    parts apply in body order). The whole body (at most REQCRYPT_MAX_BATCH_BYTES,
    and REQCRYPT_MAX_RANGES parts) is checked before anything is written: a
    malformed part, one beyond the volume or one whose length differs from its
    Content-Range fails the batch with 400/416 and writes nothing. The parts then
    enter the queue together, in one worker job, so adjacent ones merge. Each part
    is an independent write: when some fail, the problem lists them under
    ``failed`` and the others are written. If-Match and ``?fua=true`` apply to the
    batch as a whole.
    """
    volume = io.control.volume(name)
    with io.admission.slot(volume):
        headers = request_headers(request)
        boundary = multipart_boundary(header(headers, b"content-type") or "")
        if boundary is not None:
            return await write_batch(request, headers, io, volume, boundary, fua)
        return await write_range(request, headers, io, volume, fua)


async def write_range(
    request: Request, headers: dict[bytes, bytes], io: IoContext, volume: Volume, fua: bool
) -> Response:
    """A single-range PUT, received chunk by chunk into one buffer and written from it."""
    limits = io.limits
    byte_range = parse_content_range(header(headers, b"content-range"), volume.size)
    length = byte_range.length
    declared = content_length(headers.get(b"content-length", b"x"))
    if declared is None:
        raise HTTPException(411, "PUT needs Content-Length equal to the Content-Range length")
    if declared != length:
        raise InvalidRange(f"body is {declared} bytes but Content-Range covers {length}")
    if length > limits.max_body_bytes:
        raise PayloadTooLarge(
            f"body of {length} bytes exceeds the {limits.max_body_bytes}-byte maximum"
        )
    precondition = if_match(headers, volume)
    version = volume.generation
    chunk = limits.io_chunk_bytes
    body = BodyReader(request, length, limits)
    position = byte_range.first
    end = byte_range.last + 1
    size = min(chunk, length)
    held = io.budget.take(size, "a write's buffer") if budgeted(size) else 0
    try:
        with mempool.borrow(size) as buffer:
            while position < end:
                next_cut = min(end, (position // chunk + 1) * chunk)
                view = buffer[: next_cut - position]
                filled = await body.readinto(view)
                if filled < len(view):
                    raise InvalidRange(f"body ended at byte {position - byte_range.first + filled}")
                version = await io.executor.run(
                    _write, volume, position, view, fua and next_cut == end, precondition
                )
                precondition = None  # the first chunk's write held it for the whole PUT
                position = next_cut
            if await body.readinto(buffer[:1]):
                raise InvalidRange(f"body is longer than Content-Range's {length}")
    finally:
        if held:
            io.budget.give(held)
    return Response(status_code=204, headers=written(volume, version))


async def write_batch(
    request: Request,
    headers: dict[bytes, bytes],
    io: IoContext,
    volume: Volume,
    boundary: str,
    fua: bool,
) -> Response:
    """A multipart/byteranges PUT: read and check the whole body, then write every part in
    one worker job; parts that fail are named in the problem, the others are written."""
    declared = content_length(headers.get(b"content-length", b"x"))
    if declared is None:
        raise HTTPException(411, "a multipart PUT needs Content-Length")
    check_batch_bytes(declared, io.limits.max_batch_bytes)
    with ArrivingBody(io.budget, declared, io.limits.io_chunk_bytes) as arriving:
        length = arriving.length
        data = await arriving.receive(BodyReader(request, length, io.limits))
        if len(data) > length:
            raise InvalidRange(f"body is longer than its Content-Length {length}")
        if len(data) != length:
            raise InvalidRange(f"body ended at byte {len(data)} of its Content-Length {length}")
        parts = parse_byteranges_body(
            data[:length], boundary, volume.size, max_parts=io.limits.max_ranges
        )
        # The body is this request's own buffer: its parts may be encrypted where they lie.
        writes = [Io.write(part.range.first, part.data, may_overwrite=True) for part in parts]
        flush = [Io(Op.FLUSH, 0, 0)] if fua else []
        version = await io.executor.run(
            functools.partial(
                execute, volume, writes + flush, precondition=if_match(headers, volume)
            )
        )
        failed = [
            (part, write.error)
            for part, write in zip(parts, writes, strict=True)
            if write.error is not None
        ]
        if failed:
            first_error = failed[0][1]
            raise BatchFailed(
                f"{len(failed)} of {len(parts)} parts failed, the first with: "
                + (first_error.detail if isinstance(first_error, ReqcryptError) else "I/O error"),
                first_error,
                [
                    {
                        "range": f"bytes {part.range.first}-{part.range.last}",
                        "detail": error.detail if isinstance(error, ReqcryptError) else "I/O error",
                    }
                    for part, error in failed
                ],
            )
        raise_first(flush)
        return Response(status_code=204, headers=written(volume, version))


class ArrivingBody:
    """A body read whole into memory that grows with what has arrived, not with what
    Content-Length announces: an anonymous mapping of the declared length, whose pages
    the system backs only once written, so a client that declares 64 MiB and trickles two
    bytes holds a page. Each piece is taken from the byte budget before it is read (503
    when spent), and everything given back when the ``with`` block ends."""

    def __init__(self, budget: ByteBudget, length: int, piece: int) -> None:
        self.budget = budget
        self.length = length
        self._piece = piece
        self._map = mmap.mmap(-1, length + 1)  # one byte more: a longer body shows
        self._held = 0

    async def receive(self, body: BodyReader) -> memoryview:
        view = memoryview(self._map)
        counted = budgeted(len(view))
        filled = 0
        while filled < len(view):
            size = min(self._piece, len(view) - filled)
            if counted:
                self._held += self.budget.take(size, "a multipart body")
            got = await body.readinto(view[filled : filled + size])
            filled += got
            if got < size:
                break
        return view[:filled]

    def __enter__(self) -> ArrivingBody:
        return self

    def __exit__(self, *_: object) -> None:
        """Everything given back, the mapping unmapped (once no view of it is left)."""
        self.budget.give(self._held)
        self._held = 0
        with contextlib.suppress(BufferError):  # a view still out: unmapped when it goes
            self._map.close()


def raise_first(ios: Sequence[Io]) -> None:
    for io in ios:
        if io.error is not None:
            raise io.error


def _batch_delimiters(
    size: int, ranges: list[ByteRange], boundary: str
) -> tuple[list[bytes], bytes]:
    """The multipart/byteranges lines before each range, and after the last."""
    heads = [
        (
            f"\r\n--{boundary}\r\nContent-Type: {OCTETS}\r\n"
            f"Content-Range: {r.content_range(size)}\r\n\r\n"
        ).encode()
        for r in ranges
    ]
    return heads, f"\r\n--{boundary}--\r\n".encode()


def _read_batch(
    volume: Volume, ranges: list[ByteRange], heads: list[bytes], tail: bytes, length: int
) -> tuple[memoryview, int | None]:
    """The whole multipart/byteranges body in one buffer, each range read straight into
    its place: all the ranges' bios in one batch, however many ranges."""
    body = mempool.page_aligned(length)
    ios: list[Io] = []
    position = 0
    for head, byte_range in zip(heads, ranges, strict=True):
        body[position : position + len(head)] = head
        position += len(head)
        ios.append(Io.read(byte_range.first, body[position : position + byte_range.length]))
        position += byte_range.length
    body[position:] = tail

    def read() -> None:
        execute(volume, ios)
        raise_first(ios)

    return body, volume.read_versioned(read)


def _read(volume: Volume, offset: int, length: int) -> memoryview:
    """A response body: uninitialized (every byte is read into it), not a zeroed bytearray,
    and page-aligned, as the device reads straight into it (``mempool.page_aligned``)."""
    buffer = mempool.page_aligned(length)
    run(volume, Io.read(offset, buffer))
    return buffer


def _read_versioned(volume: Volume, offset: int, length: int) -> tuple[memoryview, int | None]:
    buffer = mempool.page_aligned(length)
    version = volume.read_versioned(lambda: run(volume, Io.read(offset, buffer)))
    return buffer, version


def _write(
    volume: Volume, position: int, data: memoryview, fua: bool, precondition: Precondition | None
) -> int:
    # ``data`` is the route's borrowed buffer, refilled before it is read again.
    return run(
        volume, Io.write(position, data, fua=fua, may_overwrite=True), precondition=precondition
    )


@router.post("/flush", status_code=204, responses=responses(503), openapi_extra=BEARER_SECURITY)
async def flush(name: str, io: IoDep) -> Response:
    """Returns once every write acknowledged before it is durable (fsync)."""
    volume = io.control.volume(name)
    with io.admission.slot(volume):
        await io.executor.run(run, volume, Io(Op.FLUSH, 0, 0))
    return Response(status_code=204)


@router.post(
    "/discard",
    status_code=204,
    responses=responses(409, 416, 422, 503),
    openapi_extra=BEARER_SECURITY,
)
async def discard(name: str, body: RangeIn, io: IoDep) -> Response:
    """Deallocate the whole logical blocks in the range (crypt needs allow_discards, else
    409). Advisory, as NBD's trim: partial blocks at its edges keep their data.

    Discarded sectors read back as dm-crypt returns them: the decryption of zeros.
    """
    volume = io.control.volume(name)
    with io.admission.slot(volume):
        await io.executor.run(run, volume, Io(Op.DISCARD, body.offset, body.length))
    return Response(status_code=204, headers=written(volume, None))


@router.post(
    "/write-zeroes",
    status_code=204,
    responses=responses(416, 422, 503),
    openapi_extra=BEARER_SECURITY,
)
async def write_zeroes(name: str, body: RangeIn, io: IoDep) -> Response:
    """Write encrypted zeros over the range; partial logical blocks at its edges are
    read-modify-written, as for a write."""
    volume = io.control.volume(name)
    with io.admission.slot(volume):
        await io.executor.run(run, volume, Io(Op.WRITE_ZEROES, body.offset, body.length))
    return Response(status_code=204, headers=written(volume, None))
