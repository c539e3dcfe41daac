"""A volume's block-layer events, live, in blkparse's text (``app.blk.trace``)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Annotated

import anyio
from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from app.api.deps import AdminDep, ControlDep
from app.api.problems import responses
from app.blk.trace import Event, format_event, format_trailer

router = APIRouter(prefix="/v1/volumes", tags=["volumes"], responses=responses(401, 403))

MAX_TRACE_SECONDS = 300
#: How often the stream hands what the listener gathered to the client.
_POLL_SECONDS = 0.1
_EXPIRY_GRACE_SECONDS = 30

_EXAMPLE = (
    "253,0    0        1     0.000000000  4711  Q   W 2048 + 8 [reqcrypt]\n"
    "253,0    0        2     0.000003100  4711  G   W 2048 + 8 [reqcrypt]\n"
    "253,0    0        3     0.000003900  4711  P   N [reqcrypt]\n"
    "253,0    0        4     0.000011200  4712  Q   W 2056 + 8 [reqcrypt]\n"
    "253,0    0        5     0.000012000  4712  M   W 2056 + 8 [reqcrypt]\n"
    "253,0    0        6     0.000061800  4711  U   N [reqcrypt] 1\n"
    "253,0    0        7     0.000062300  4711  I   W 2048 + 16 [reqcrypt]\n"
    "253,0    0        8     0.000064000  4711  D   W 2048 + 16 [reqcrypt]\n"
    "253,0    0        9     0.000090500  4711  m   N crypt encrypt 2048 + 16 calls=1 "
    "mode=bulk units=16 unit_size=512 iv=plain64\n"
    "253,0    0       10     0.000170000  4711  C   W 2048 + 16 [0]\n"
    "Events (253,0): 10 entries\n"
    "Skips: 0 forward (0 -   0.0%)\n"
)


@router.get(
    "/{name}/trace",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "blkparse text, streamed for `seconds`, then the event and skip counts",
            "content": {"text/plain": {"schema": {"type": "string"}, "example": _EXAMPLE}},
        },
        **responses(404, 422, 503),
    },
)
async def trace_volume(
    name: str,
    control: ControlDep,
    _: AdminDep,
    seconds: Annotated[
        int, Query(ge=1, le=MAX_TRACE_SECONDS, description="how long to trace")
    ] = 10,
) -> StreamingResponse:
    """blktrace of the volume: Q, M/F, G, P/U, I, D, C and the crypt engine calls (``m``).

    Events the client does not read in time are dropped and counted in the closing
    ``Skips`` line; I/O never waits for the trace. At most four traces per volume.
    """
    queue = control.volume(name).queue
    # Expires by itself should the stream never start (a client gone before it).
    listener = queue.listen(expires=time.monotonic() + seconds + _EXPIRY_GRACE_SECONDS)
    start_ns = time.perf_counter_ns()
    seq = 0

    def render(events: list[Event]) -> str:
        nonlocal seq
        lines = []
        for event in events:
            seq += 1
            lines.append(format_event(event, seq, start_ns) + "\n")
        return "".join(lines)

    async def stream() -> AsyncIterator[str]:
        try:
            deadline = anyio.current_time() + seconds
            while (left := deadline - anyio.current_time()) > 0:
                await anyio.sleep(min(_POLL_SECONDS, left))
                if chunk := render(listener.drain()):
                    yield chunk
        finally:
            queue.unlisten(listener)
        yield render(listener.drain()) + format_trailer(listener.delivered, listener.dropped)

    return StreamingResponse(stream(), media_type="text/plain; charset=utf-8")
