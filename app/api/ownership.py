"""Cluster routing: a request for a volume this node does not serve goes to its owner.

Installed only on a cluster node (REQCRYPT_NODE_ID). For ``/v1/volumes/{name}…``
when ``name`` is not a volume this node serves, the owner is looked up in SQL
(off the data path: a served volume costs one dict lookup here) and:

- the data path (``/data``, ``/flush``, ``/discard``, ``/write-zeroes``) answers
  **307** with ``Location`` = the owner's URL + the same path and query
  (REQCRYPT_CLUSTER_DATA_PATH=redirect, the default). 307 keeps the method and
  body, and the bytes then flow client → owner once instead of through a second
  node; but curl ``-L`` and httpx drop ``Authorization`` on the way to another
  origin, so the client must send its token again. With ``proxy`` the node
  streams the request to the owner and the answer back, chunk by chunk, with every
  end-to-end header (Range, If-Match, ETag, Content-Range…): any client works, at
  the cost of every byte crossing this node too;
- every control call (GET info/status/table, suspend, resume, load, message,
  PATCH, rename, DELETE, move…) is **forwarded**: this node replays it to the
  owner with the caller's headers (its token included) and relays the answer,
  so a lifecycle change always runs on the owner, in its lock and its lease;
- ``POST /v1/volumes`` (create) is forwarded to the least-loaded live node, or,
  when its table maps other volumes (``/dev/mapper/…``), to the node serving them:
  a stacked volume is served where its lower volumes are (409 if they are served
  by different nodes).

A forwarded or proxied request carries ``Reqcrypt-Forwarded-By``; a node never
forwards one again (an ownership change in between answers 503, retry). No owner alive (its
lease expired, failover pending) answers 503 with Retry-After. A caller without
a valid token is not routed: the local route answers 401 as everywhere.

How long a forwarded call may wait is tied to the other node's heartbeat, not to a
fixed timeout: a suspend that drains, or a move that flushes and hands over, may
legitimately take ``suspend_wait_seconds`` and more, and all the while the owner
heartbeats (its lease thread never waits for the control lock). So the call is
watched every renew interval and abandoned with 503 + Retry-After as soon as that
node's heartbeat is older than a lease — a frozen or dead owner answers within
about a lease. Connecting is bounded apart (``CONNECT_SECONDS``): a node that
cannot even be reached is not waited for.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING
from urllib.parse import quote

import anyio
import httpx
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.deps import authorize
from app.api.problems import problem
from app.db.leases import Owner
from app.dm.table import parse_table
from app.errors import ReqcryptError

if TYPE_CHECKING:
    from app.state import State

FORWARDED_BY = "reqcrypt-forwarded-by"
CONNECT_SECONDS = 2.0
"""Connecting to another node (loopback or a LAN): longer means it is not there."""
DATA_SUFFIXES = frozenset({"/data", "/flush", "/discard", "/write-zeroes"})
_VOLUME_PATH = re.compile(r"^/v1/volumes/([^/]+)(/.*)?$")
_CONNECTION = frozenset(
    {b"host", b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade"}
)
"""Headers of one connection, never relayed."""
_HOP_BY_HOP = _CONNECTION | {b"content-length"}
"""Also Content-Length where a body is read whole and sent again (httpx sets it)."""


class OwnerRouting:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state: State = scope["app"].state.reqcrypt
        path: str = scope["path"]
        match = _VOLUME_PATH.match(path)
        create = path == "/v1/volumes" and scope["method"] == "POST"
        local = match is not None and match.group(1) in state.control.volumes
        if (
            local  # first: a served volume's data path costs nothing more here
            or (match is None and not create)
            or (match is None and _forwarded(scope))
            or not _authorized(state, scope)
        ):
            await self.app(scope, receive, send)
        elif match is not None and _forwarded(scope):
            await self._moved_on(state, scope, receive, send, match.group(1))
        elif match is None:
            await self._place(state, scope, receive, send)
        else:
            await self._route(state, scope, receive, send, match.group(1), match.group(2) or "")

    async def _moved_on(
        self, state: State, scope: Scope, receive: Receive, send: Send, name: str
    ) -> None:
        """A forwarded or proxied request for a volume this node does not serve: its owner
        changed on the way. Never passed on again (no loops): 503, the caller retries."""
        assert state.cluster is not None
        owner = await anyio.to_thread.run_sync(state.cluster.leases.owner_of, name)
        if owner is None:  # no such volume: the local route answers 404
            await self.app(scope, receive, send)
            return
        await _unavailable(
            scope,
            send,
            f"volume {name} is served by node {owner.node or '(none yet)'}, not this one: "
            "its owner changed while the request was forwarded; retry",
        )

    async def _route(
        self, state: State, scope: Scope, receive: Receive, send: Send, name: str, suffix: str
    ) -> None:
        assert state.cluster is not None
        owner = await anyio.to_thread.run_sync(state.cluster.leases.owner_of, name)
        if owner is None:  # no such volume: the local route answers 404
            await self.app(scope, receive, send)
            return
        if not owner.live or owner.url is None or owner.node is None:
            await _unavailable(
                scope,
                send,
                f"volume {name} has no live owner (node {owner.node or 'none'}); "
                "another node takes it over within a lease",
            )
            return
        if owner.node == state.cluster.node:
            await _unavailable(
                scope, send, f"volume {name} is being taken over by this node; retry"
            )
            return
        if suffix in DATA_SUFFIXES and state.settings.cluster_data_path == "proxy":
            await proxy(state, scope, receive, send, owner.node, owner.url)
            return
        if suffix in DATA_SUFFIXES:
            location = owner.url + quote(scope["path"])
            if scope["query_string"]:
                location += "?" + scope["query_string"].decode("latin-1")
            await _drain(receive)
            response = Response(status_code=307, headers={"Location": location})
            await response(scope, receive, send)
            return
        await forward(state, scope, receive, send, owner.node, owner.url)

    async def _place(self, state: State, scope: Scope, receive: Receive, send: Send) -> None:
        assert state.cluster is not None
        body = await _read_body(receive)
        receive = _replay(body, receive)
        lowers = _mapped_volumes(state, body)
        if lowers:
            owners = [
                await anyio.to_thread.run_sync(state.cluster.leases.owner_of, lower)
                for lower in lowers
            ]
            known = {
                lower: owner
                for lower, owner in zip(lowers, owners, strict=True)
                if owner is not None
            }
            if known:  # one that does not exist: the node creating the volume answers 404
                await self._place_stacked(state, scope, receive, send, known)
                return
        target = await anyio.to_thread.run_sync(state.cluster.place)
        if target is None or target.node == state.cluster.node:
            await self.app(scope, receive, send)
            return
        await forward(state, scope, receive, send, target.node, target.url)

    async def _place_stacked(
        self, state: State, scope: Scope, receive: Receive, send: Send, lowers: dict[str, Owner]
    ) -> None:
        """Create a stacked volume on the node serving every volume its table maps."""
        assert state.cluster is not None
        nodes = {owner.node for owner in lowers.values()}
        if len(nodes) > 1:
            served = ", ".join(f"{name} by node {owner.node}" for name, owner in lowers.items())
            detail = (
                f"the table maps volumes served by different nodes ({served}); a stacked "
                "volume is served by the node serving every volume it maps: move them "
                "onto one node first"
            )
            response = problem(409, detail, instance=scope["path"])
            await response(scope, _no_body, send)
            return
        owner = next(iter(lowers.values()))
        if owner.node == state.cluster.node and lowers.keys() <= state.control.volumes.keys():
            await self.app(scope, receive, send)
        elif (
            not all(owner.live for owner in lowers.values())
            or owner.url is None
            or owner.node is None
        ):
            await _unavailable(
                scope,
                send,
                f"volume(s) {', '.join(lowers)} mapped by the table are failing over; a "
                "volume stacked on them is created on their next node: retry",
            )
        elif owner.node == state.cluster.node:
            await _unavailable(
                scope,
                send,
                f"volume(s) {', '.join(lowers)} are being taken over by this node; retry",
            )
        else:
            await forward(state, scope, receive, send, owner.node, owner.url)


def _mapped_volumes(state: State, body: bytes) -> list[str]:
    """The volumes a create request's table maps (none if it cannot be read: the node that
    creates the volume then says what is wrong with it)."""
    try:
        text = json.loads(body)["table"]
        table = parse_table(text, limits=state.control.limits.table)
    except (ValueError, KeyError, TypeError, ReqcryptError):
        return []
    return sorted(table.volume_names())


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


def _forwarded(scope: Scope) -> bool:
    return any(key == FORWARDED_BY.encode() for key, _ in scope["headers"])


def _authorized(state: State, scope: Scope) -> bool:
    header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
    try:
        authorize(state, header.decode("latin-1") if header is not None else None)
    except HTTPException:
        return False
    return True


async def _drain(receive: Receive) -> None:
    """Consume an unread request body, so the connection can carry the next request."""
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body"):
            return


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


async def _unavailable(scope: Scope, send: Send, detail: str) -> None:
    response = problem(503, detail, instance=scope["path"], headers={"Retry-After": "1"})
    await response(scope, _no_body, send)


async def _no_body() -> dict[str, object]:
    return {"type": "http.disconnect"}


async def forward(
    state: State, scope: Scope, receive: Receive, send: Send, node: str, base: str
) -> None:
    """Replay a control request to ``base`` (another node, ``node``) and relay its answer,
    for as long as that node heartbeats."""
    assert state.cluster is not None
    body = await _read_body(receive)
    headers = [
        (key.decode("latin-1"), value.decode("latin-1"))
        for key, value in scope["headers"]
        if key not in _HOP_BY_HOP
    ]
    headers.append((FORWARDED_BY, state.cluster.node))
    url = base + quote(scope["path"])
    if scope["query_string"]:
        url += "?" + scope["query_string"].decode("latin-1")
    try:
        answer = await _while_alive(state, node, scope["method"], url, headers, body)
    except httpx.HTTPError as error:
        await _unavailable(
            scope, send, f"the owner node at {base} did not answer ({type(error).__name__}); retry"
        )
        return
    if answer is None:
        await _unavailable(scope, send, _stopped_heartbeating(node, base))
        return
    relayed = {
        key: value
        for key, value in answer.headers.items()
        if key.lower().encode() not in _HOP_BY_HOP and key.lower() != "content-encoding"
    }
    response = Response(answer.content, status_code=answer.status_code, headers=relayed)
    await response(scope, _no_body, send)


class _ClientGone(Exception):
    """The client left while its body was being streamed to the owner."""


async def _stream_body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise _ClientGone
        chunk: bytes = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body"):
            return


class OwnerGone(Exception):
    """The owner stopped heartbeating after its answer started: the connection is cut."""


async def proxy(
    state: State, scope: Scope, receive: Receive, send: Send, node: str, base: str
) -> None:
    """Stream a data-path request to ``base`` (the owner, ``node``) and its answer back:
    no body is held whole here, the owner applies its own body limits, and every
    end-to-end header (Authorization, Range, If-*, Content-Range, ETag, Content-Length)
    passes unchanged, so HEAD and conditional requests answer as the owner would. Bounded
    by the owner's heartbeat as a forwarded call is."""
    assert state.cluster is not None
    assert state.forwarder is not None
    forwarder = state.forwarder
    headers = [
        (key.decode("latin-1"), value.decode("latin-1"))
        for key, value in scope["headers"]
        if key not in _CONNECTION
    ]
    headers.append((FORWARDED_BY, state.cluster.node))
    has_body = any(
        (key == b"content-length" and value != b"0") or key == b"transfer-encoding"
        for key, value in scope["headers"]
    )
    url = base + quote(scope["path"])
    if scope["query_string"]:
        url += "?" + scope["query_string"].decode("latin-1")
    request = forwarder.build_request(
        scope["method"], url, headers=headers, content=_stream_body(receive) if has_body else None
    )
    answers: list[httpx.Response] = []
    started = False

    async def relay() -> None:
        nonlocal started
        answer = await forwarder.send(request, stream=True)
        answers.append(answer)
        await send(
            {
                "type": "http.response.start",
                "status": answer.status_code,
                "headers": [(k, v) for k, v in answer.headers.raw if k.lower() not in _CONNECTION],
            }
        )
        started = True
        async for chunk in answer.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    try:
        alive = await _unless_dead(state, node, relay)
    except _ClientGone:
        return
    except httpx.HTTPError as error:
        if started:
            raise
        await _unavailable(
            scope, send, f"the owner node at {base} did not answer ({type(error).__name__}); retry"
        )
        return
    finally:
        for answer in answers:
            await answer.aclose()
    if alive:
        return
    if started:
        raise OwnerGone(f"node {node} stopped heartbeating while its answer was relayed")
    await _unavailable(scope, send, _stopped_heartbeating(node, base))


def _stopped_heartbeating(node: str, base: str) -> str:
    return (
        f"node {node} at {base} stopped heartbeating while it handled the call "
        "(frozen or dead): its volumes fail over within a lease; retry"
    )


async def _while_alive(
    state: State,
    node: str,
    method: str,
    url: str,
    headers: list[tuple[str, str]],
    body: bytes,
) -> httpx.Response | None:
    """The answer to the request, or None once ``node``'s heartbeat is older than a lease
    (the request is then abandoned). Raises ``httpx.HTTPError`` if it fails first."""
    assert state.forwarder is not None
    forwarder = state.forwarder
    answers: list[httpx.Response] = []

    async def call() -> None:
        answers.append(await forwarder.request(method, url, headers=headers, content=body))

    if not await _unless_dead(state, node, call):
        return None
    return answers[0]


async def _unless_dead(state: State, node: str, work: Callable[[], Awaitable[None]]) -> bool:
    """Run ``work`` for as long as ``node`` heartbeats: False when it was abandoned because
    that node's heartbeat grew older than a lease. ``work``'s own exception is raised as
    it is (not in a group)."""
    assert state.cluster is not None
    cluster = state.cluster
    failures: list[Exception] = []
    finished = False

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
            await anyio.sleep(cluster.renew_interval)
            try:
                alive = await anyio.to_thread.run_sync(cluster.leases.node_live, node)
            except Exception:  # the database is away: no verdict, the client timeout bounds
                alive = True
            if not alive:
                scope.cancel()

    async with anyio.create_task_group() as group:
        group.start_soon(run, group.cancel_scope)
        group.start_soon(watch, group.cancel_scope)
    if failures:
        raise failures[0]
    return finished
