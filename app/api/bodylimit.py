"""A bound on control-plane request bodies (JSON), enforced before they are read.

FastAPI reads a JSON body whole before any dependency or route runs, and a cluster node
reads a create call's body to place it, so the bound has to sit in front of both. Only
the data path (``/v1/volumes/{name}/data``, exactly: ``paths.DATA_PATH``) is exempt: it
streams and checks its own limits (REQCRYPT_MAX_BODY_BYTES, MAX_BATCH_BYTES) from
Content-Length, as this does. A chunked body without Content-Length is counted as it
arrives and refused once past the bound, whoever is reading it.
"""

from __future__ import annotations

from collections.abc import Awaitable

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.paths import DATA_PATH
from app.api.problems import problem
from app.api.ranges import content_length


class _Overflow(HTTPException):
    """A chunked body went past the bound while something read it: FastAPI answers it as
    any HTTPException, and here answers it when a middleware was reading."""


class ControlBodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self, size: int | None) -> str:
        shown = "a body" if size is None else f"a body of {size} bytes"
        return (
            f"{shown} exceeds the {self.max_bytes}-byte maximum of a control request "
            "(REQCRYPT_MAX_CONTROL_BODY_BYTES)"
        )

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        if scope["type"] != "http" or DATA_PATH.match(scope["path"]):
            # Handed on, not awaited: no frame of this middleware for the event loop to
            # re-enter each time a data request resumes.
            return self.app(scope, receive, send)
        return self._limited(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, size: int | None) -> None:
        response = problem(
            413, self._too_large(size), instance=scope["path"], headers={"Connection": "close"}
        )
        await response(scope, receive, send)

    async def _limited(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None:
            # The server has already refused a Content-Length that is not digits.
            size = content_length(declared)
            if size is not None and size > self.max_bytes:
                await self._refuse(scope, receive, send, size)
                return
            await self.app(scope, receive, send)
            return
        received = 0
        started = False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise _Overflow(413, self._too_large(None), headers={"Connection": "close"})
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except _Overflow:
            if started:  # an answer already under way can only be cut short
                raise
            await self._refuse(scope, receive, send, None)
