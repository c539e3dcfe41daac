"""``/v1/null/*``: the HTTP ceiling the benchmarks compare volume I/O against.

Not part of the production API: ``create_app`` mounts it only when
``REQCRYPT_BENCH_CEILING=1`` (``Settings.bench_ceiling``), as the HTTP
benchmarks do.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse

from app.api.deadline import BodyReader
from app.api.deps import BEARER_SECURITY, IoDep
from app.api.problems import responses
from app.api.ranges import ByteRange, parse_range
from app.blk import mempool

OCTETS = "application/octet-stream"


router = APIRouter(prefix="/v1/null", tags=["data"], responses=responses(401))


@router.put("/data", status_code=204, responses=responses(400), openapi_extra=BEARER_SECURITY)
async def null_write(request: Request, io: IoDep, thread: bool = False) -> Response:
    """The HTTP ceiling: receives a body as a volume write does (chunk by chunk into one
    buffer, under the same deadlines), touches nothing.

    ``?thread=true`` adds the one worker-thread round trip every volume I/O makes,
    so benchmarks can tell that cost from the volume's own.
    """
    limits = io.limits
    length = int(request.headers.get("content-length", limits.max_body_bytes))
    body = BodyReader(request, length, limits)
    with mempool.borrow(min(limits.io_chunk_bytes, max(length, 1))) as buffer:
        while await body.readinto(buffer):
            pass
    if thread:
        await io.executor.run(_nothing)
    return Response(status_code=204)


def _nothing() -> None:
    """The work of the ceiling endpoints' thread round trip."""


@router.get(
    "/data",
    responses={206: {"content": {OCTETS: {}}}, **responses(416)},
    openapi_extra=BEARER_SECURITY,
)
async def null_read(
    request: Request,
    io: IoDep,
    size: Annotated[int, Query(ge=1, le=1 << 30, description="pretended volume size")] = 1 << 30,
    thread: bool = False,
) -> Response:
    """The HTTP ceiling: answers a single Range with zeros, as a volume read would
    (``?thread=true``: plus one worker-thread round trip)."""
    if thread:
        await io.executor.run(_nothing)
    ranges = parse_range(request.headers.get("range", f"bytes=0-{size - 1}"), size, 1) or [
        ByteRange(0, size - 1)
    ]
    byte_range = ranges[0]
    headers = {
        "Content-Range": byte_range.content_range(size),
        "Content-Length": str(byte_range.length),
    }
    chunk = io.limits.io_chunk_bytes
    if byte_range.length <= chunk:
        return Response(
            memoryview(_zeros(chunk))[: byte_range.length],
            status_code=206,
            media_type=OCTETS,
            headers=headers,
        )
    return StreamingResponse(
        _zero_stream(byte_range.length, chunk), status_code=206, media_type=OCTETS, headers=headers
    )


@functools.cache
def _zeros(size: int) -> bytes:
    return bytes(size)


async def _zero_stream(length: int, chunk: int) -> AsyncIterator[memoryview]:
    """Zeros in chunks, like a volume's streamed read: memory stays bounded."""
    zeros = memoryview(_zeros(chunk))
    while length:
        size = min(chunk, length)
        yield zeros[:size]
        length -= size
