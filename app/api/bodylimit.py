"""A bound on control-plane request bodies (JSON), enforced before they are read.

FastAPI reads a JSON body whole before any dependency or route runs, so the
bound has to sit in front of it. The data path (``…/data``) is exempt: it
streams and checks its own limits (REQCRYPT_MAX_BODY_BYTES, MAX_BATCH_BYTES)
from Content-Length, as this does. A chunked body without Content-Length is
counted as it arrives and refused once past the bound.
"""

from __future__ import annotations

from collections.abc import Awaitable

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.problems import problem


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
        if scope["type"] != "http" or scope["path"].endswith("/data"):
            # Handed on, not awaited: no frame of this middleware for the event loop to
            # re-enter each time a data request resumes.
            return self.app(scope, receive, send)
        return self._limited(scope, receive, send)

    async def _limited(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None:
            # The server has already refused a malformed Content-Length.
            if declared.isdigit() and int(declared) > self.max_bytes:
                response = problem(
                    413,
                    self._too_large(int(declared)),
                    instance=scope["path"],
                    headers={"Connection": "close"},
                )
                await response(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise HTTPException(413, self._too_large(None), headers={"Connection": "close"})
            return message

        await self.app(scope, counted, send)
