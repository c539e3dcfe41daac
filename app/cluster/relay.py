"""Relaying a request to the node that owns its volume, over plain ASGI.

``proxy`` streams a request to the owner and its answer back, chunk by chunk, with every
end-to-end header (the caller's token, Range, If-Match, ETag, Content-Range…), and adds
``Reqcrypt-Forwarded-By``, so the owner never passes the request on again. Control calls
and the data path go the same way: nothing is held whole here (the client's connection
paces the owner's answer), so a relayed answer costs this node what a local one does.

How long either may wait is tied to the owner's heartbeat, not to a fixed timeout: a
suspend that drains, or a move that flushes and hands over, may legitimately take
``suspend_wait_seconds`` and more, and all the while the owner heartbeats (its lease
thread never waits for the control lock). So the call is watched every renew interval
and abandoned (``OwnerUnreachable``, answered 503 + Retry-After) as soon as that node's
heartbeat is older than a lease — a frozen or dead owner answers within about a lease.
Connecting is bounded apart (``CONNECT_SECONDS``): a node that cannot even be reached
is not waited for.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import quote

import anyio
import httpx

from app.cluster.node import ClusterNode

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

FORWARDED_BY = "reqcrypt-forwarded-by"
CONNECT_SECONDS = 2.0
"""Connecting to another node (loopback or a LAN): longer means it is not there."""
_CONNECTION = frozenset(
    {b"host", b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade"}
)
"""Headers of one connection, never relayed."""


class OwnerUnreachable(Exception):
    """The owner did not answer, or stopped heartbeating before its answer started."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class OwnerGone(Exception):
    """The owner stopped heartbeating after its answer started: the connection is cut."""


class _ClientGone(Exception):
    """The client left while its body was being streamed to the owner."""


def forwarded(scope: Scope) -> bool:
    return any(key == FORWARDED_BY.encode() for key, _ in scope["headers"])


def target_url(base: str, scope: Scope) -> str:
    """The same path and query on the node at ``base``."""
    url = base + quote(scope["path"])
    if scope["query_string"]:
        url += "?" + scope["query_string"].decode("latin-1")
    return url


async def _stream_body(receive: Receive, done: anyio.Event) -> AsyncIterator[bytes]:
    try:
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise _ClientGone
            chunk: bytes = message.get("body", b"")
            if chunk:
                yield chunk
            if not message.get("more_body"):
                return
    finally:
        done.set()


async def _until_disconnect(receive: Receive, body_read: anyio.Event) -> None:
    """Returns once the client has gone (its body, if any, read to its end before)."""
    await body_read.wait()
    while (await receive())["type"] != "http.disconnect":
        pass


class Relay:
    def __init__(self, cluster: ClusterNode, client: httpx.AsyncClient) -> None:
        self.cluster = cluster
        self.client = client

    async def proxy(self, scope: Scope, receive: Receive, send: Send, node: str, base: str) -> None:
        """Stream a request to ``base`` (the owner, ``node``) and its answer back: no body
        is held whole here, the owner applies its own body limits, and every end-to-end
        header (Authorization, Range, If-*, Content-Range, ETag, Content-Length) passes
        unchanged, so HEAD and conditional requests answer as the owner would. Each piece
        of the answer waits until the client's connection takes the last (the server's
        flow control), and a client that leaves ends the relay.
        ``OwnerUnreachable`` before the answer started; ``OwnerGone`` after."""
        headers = [
            (key.decode("latin-1"), value.decode("latin-1"))
            for key, value in scope["headers"]
            if key not in _CONNECTION
        ]
        headers.append((FORWARDED_BY, self.cluster.node))
        has_body = any(
            (key == b"content-length" and value != b"0") or key == b"transfer-encoding"
            for key, value in scope["headers"]
        )
        body_read = anyio.Event()
        if not has_body:
            body_read.set()
        request = self.client.build_request(
            scope["method"],
            target_url(base, scope),
            headers=headers,
            content=_stream_body(receive, body_read) if has_body else None,
        )
        answers: list[httpx.Response] = []
        started = False

        async def relay() -> None:
            nonlocal started
            answer = await self.client.send(request, stream=True)
            answers.append(answer)
            await send(
                {
                    "type": "http.response.start",
                    "status": answer.status_code,
                    "headers": [
                        (k, v) for k, v in answer.headers.raw if k.lower() not in _CONNECTION
                    ],
                }
            )
            started = True
            async for chunk in answer.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        try:
            alive = await self._unless_dead(node, relay, _until_disconnect(receive, body_read))
        except _ClientGone:
            return
        except httpx.HTTPError as error:
            if started:
                raise
            raise OwnerUnreachable(_did_not_answer(base, error)) from None
        finally:
            for answer in answers:
                await answer.aclose()
        if alive is not False:
            return
        if started:
            raise OwnerGone(f"node {node} stopped heartbeating while its answer was relayed")
        raise OwnerUnreachable(_stopped_heartbeating(node, base))

    async def _unless_dead(
        self, node: str, work: Callable[[], Awaitable[None]], client_gone: Awaitable[None]
    ) -> bool | None:
        """Run ``work`` for as long as ``node`` heartbeats and the client stays: False when
        it was abandoned because that node's heartbeat grew older than a lease, None when
        the client left first. ``work``'s own exception is raised as it is (not in a group)."""
        cluster = self.cluster
        failures: list[Exception] = []
        finished = False
        left = False

        async def run(scope: anyio.CancelScope) -> None:
            nonlocal finished
            try:
                await work()
            except Exception as error:
                failures.append(error)
            finished = True
            scope.cancel()

        async def watch(scope: anyio.CancelScope) -> None:
            while True:
                await anyio.sleep(cluster.settings.renew_interval)
                try:
                    alive = await anyio.to_thread.run_sync(cluster.leases.node_live, node)
                except Exception:  # the database is away: no verdict, the client timeout bounds
                    alive = True
                if not alive:
                    scope.cancel()

        async def leave(scope: anyio.CancelScope) -> None:
            nonlocal left
            await client_gone
            left = True
            scope.cancel()

        async with anyio.create_task_group() as group:
            group.start_soon(run, group.cancel_scope)
            group.start_soon(watch, group.cancel_scope)
            group.start_soon(leave, group.cancel_scope)
        if failures:
            raise failures[0]
        return None if left and not finished else finished


def _did_not_answer(base: str, error: httpx.HTTPError) -> str:
    return f"the owner node at {base} did not answer ({type(error).__name__}); retry"


def _stopped_heartbeating(node: str, base: str) -> str:
    return (
        f"node {node} at {base} stopped heartbeating while it handled the call "
        "(frozen or dead): its volumes fail over within a lease; retry"
    )
