"""The cluster's routing as ASGI middleware: a request for a volume this node does not
serve goes where ``app.cluster.routing`` decides, relayed by ``app.cluster.relay``.

Installed only on a cluster node (REQCRYPT_NODE_ID). A served volume's request costs one
dict lookup here and passes on; a caller without a valid token is not routed (the local
route answers 401 as everywhere). What is left here is HTTP: a 307 for a redirected data
path, the owner's answer relayed, and refusals rendered as problem+json.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.deps import authorize_scope
from app.api.paths import VOLUME_PATH
from app.api.problems import problem
from app.cluster.relay import OwnerUnreachable, Relay, forwarded, target_url
from app.cluster.routing import Elsewhere, Refused, Route, Router

if TYPE_CHECKING:
    from app.state import State


class OwnerRouting:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state: State = scope["app"].state.reqcrypt
        path: str = scope["path"]
        match = VOLUME_PATH.match(path)
        create = path == "/v1/volumes" and scope["method"] == "POST"
        if (
            # first: a served volume's data path costs nothing more here
            (match is not None and state.control.serves(match.group(1)))
            or (match is None and (not create or forwarded(scope)))
            or not _authorized(state, scope)
        ):
            await self.app(scope, receive, send)
            return
        assert state.cluster is not None
        router = Router(
            state.cluster,
            data_path=state.cluster.settings.cluster_data_path,
            table_limits=state.control.table_limits,
        )
        if match is None:
            # Bounded by REQCRYPT_MAX_CONTROL_BODY_BYTES (``ControlBodyLimit``, outside this).
            body = await _read_body(receive)
            receive = _replay(body, receive)
            route = await anyio.to_thread.run_sync(router.create, body)
        else:
            name, suffix, again = match.group(1), match.group(2) or "", forwarded(scope)
            route = await anyio.to_thread.run_sync(
                lambda: router.volume(name, suffix, forwarded=again)
            )
        await self._follow(state, route, scope, receive, send)

    async def _follow(
        self, state: State, route: Route, scope: Scope, receive: Receive, send: Send
    ) -> None:
        if isinstance(route, Refused):
            await _refuse(scope, send, route.status, route.detail)
            return
        if not isinstance(route, Elsewhere):
            await self.app(scope, receive, send)
            return
        if route.how == "redirect":
            await _drain(receive)
            location = target_url(route.url, scope)
            await Response(status_code=307, headers={"Location": location})(scope, receive, send)
            return
        assert state.cluster is not None
        assert state.forwarder is not None
        try:
            await Relay(state.cluster, state.forwarder).proxy(
                scope, receive, send, route.node, route.url
            )
        except OwnerUnreachable as unreachable:
            await _refuse(scope, send, 503, unreachable.detail)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` (already read) once, then waits on the client."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def _authorized(state: State, scope: Scope) -> bool:
    try:
        authorize_scope(state, scope)
    except HTTPException:
        return False
    return True


async def _drain(receive: Receive) -> None:
    """Consume an unread request body, so the connection can carry the next request."""
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body"):
            return


async def _refuse(scope: Scope, send: Send, status: int, detail: str) -> None:
    headers = {"Retry-After": "1"} if status == 503 else None
    response = problem(status, detail, instance=scope["path"], headers=headers)
    await response(scope, _no_body, send)


async def _no_body() -> dict[str, object]:
    return {"type": "http.disconnect"}
