"""A bound on control-plane request bodies (JSON), enforced before they are read.

FastAPI reads a JSON body whole before any dependency or route runs (authentication
included), and a cluster node reads a create call's body to place it, so the bound has
to sit in front of both. Only the data path (``/v1/volumes/{name}/data``, exactly:
``paths.DATA_PATH``) is exempt: it streams and checks its own limits
(REQCRYPT_MAX_BODY_BYTES, MAX_BATCH_BYTES) from Content-Length, as this does.

- A body past REQCRYPT_MAX_CONTROL_BODY_BYTES is refused (413) from its Content-Length;
  a chunked one is counted as it arrives and refused once past the bound, whoever is
  reading it.
- A body larger than ``SMALL_BODY``, or chunked, is read only for a caller with a valid
  token: 401 first, so no one without a token makes the server hold more than that.
- Such a body is held against the byte budget (``app.io.budget``, 503 when spent) until
  the request ends, as the data path's buffers are.
"""

from __future__ import annotations

from collections.abc import Awaitable

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.deps import authorize_scope
from app.api.paths import DATA_PATH
from app.api.problems import problem
from app.api.ranges import content_length
from app.errors import Unavailable
from app.io.budget import ByteBudget

SMALL_BODY = 64 << 10
"""A control body up to this size is read before authentication, as any small request."""


class _Refused(HTTPException):
    """A chunked body went past the bound, or the budget, while something read it: FastAPI
    answers it as any HTTPException, and here answers it when a middleware was reading."""


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

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, error: HTTPException
    ) -> None:
        headers = {**(error.headers or {}), "Connection": "close"}
        response = problem(error.status_code, error.detail, instance=scope["path"], headers=headers)
        await response(scope, receive, send)

    async def _limited(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        chunked = declared is None and any(k == b"transfer-encoding" for k, _ in scope["headers"])
        # The server has already refused a Content-Length that is not digits.
        size = content_length(declared) if declared is not None else None
        if size is not None and size > self.max_bytes:
            await self._refuse(scope, receive, send, HTTPException(413, self._too_large(size)))
            return
        if not chunked and (size is None or size <= SMALL_BODY):
            await self.app(scope, receive, send)
            return
        state = scope["app"].state.reqcrypt
        budget: ByteBudget = state.budget
        held = 0
        try:
            authorize_scope(state, scope)
            if size is not None:
                held = budget.take(size, "a control request's body")
        except HTTPException as error:
            await self._refuse(scope, receive, send, error)
            return
        except Unavailable as spent:
            retry = {"Retry-After": str(spent.retry_after)}
            await self._refuse(scope, receive, send, HTTPException(503, spent.detail, retry))
            return
        try:
            if chunked:
                await self._counted(scope, receive, send, budget)
            else:
                await self.app(scope, receive, send)
        finally:
            budget.give(held)

    async def _counted(
        self, scope: Scope, receive: Receive, send: Send, budget: ByteBudget
    ) -> None:
        """A chunked body, counted and held against the budget as it arrives."""
        received = held = 0
        started = False

        async def counted() -> Message:
            nonlocal received, held
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise _Refused(413, self._too_large(None), {"Connection": "close"})
            while held < received:
                try:
                    held += budget.take(SMALL_BODY, "a control request's body")
                except Unavailable as spent:
                    retry = {"Retry-After": "1", "Connection": "close"}
                    raise _Refused(503, spent.detail, retry) from None
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except _Refused as refused:
            if started:  # an answer already under way can only be cut short
                raise
            await self._refuse(scope, receive, send, refused)
        finally:
            budget.give(held)
