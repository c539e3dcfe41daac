"""What a client can make the service hold is bounded: one canonical path for every
decision, the control-body bound on every path but the data route, and the byte budget
(REQCRYPT_MAX_BUFFERED_BYTES) under every large buffer a request asks for."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.config import Settings
from tests.support.app import ADMIN_TOKEN
from tests.support.factories import make_device, make_volume, xts_table

pytestmark = pytest.mark.anyio

MiB = 1 << 20


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"max_control_body_bytes": 1 * MiB, "max_buffered_bytes": 8 * MiB}
    )


@pytest.fixture
async def volume(client: httpx.AsyncClient) -> None:
    await make_device(client, "sda2", 16 * MiB)
    await make_volume(client, "v", table=xts_table(sectors=32768))


async def raw_request(
    app: FastAPI,
    method: str,
    path: str,
    headers: list[tuple[bytes, bytes]],
    body: bytes = b"",
) -> tuple[int, bytes]:
    """One request as a server hands it to the app: the path exactly as given (httpx would
    resolve its dot segments first), the headers exactly as given."""
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"test"), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
        "app": app,
    }
    sent = False
    status = 0
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.sleep(3600)
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


def bearer(settings: Settings) -> tuple[bytes, bytes]:
    return (b"authorization", f"Bearer {ADMIN_TOKEN}".encode())


@pytest.mark.parametrize(
    "path",
    [
        "/v1/volumes/v/../v/data",
        "/v1/volumes/./v/data",
        "/v1/volumes/v/data/..",
        "/v1/volumes/v/..",
    ],
)
async def test_a_path_with_a_dot_segment_is_refused_before_anything_routes_on_it(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings, volume: None, path: str
) -> None:
    status, body = await raw_request(app, "GET", path, [bearer(settings)])
    assert status == 400
    assert b"dot segments" in body


async def test_a_name_with_dots_inside_is_not_a_dot_segment(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings
) -> None:
    await make_device(client, "sda2", 1 * MiB)
    await make_volume(client, "v..1", table=xts_table(sectors=2048))
    status, _ = await raw_request(app, "GET", "/v1/volumes/v..1", [bearer(settings)])
    assert status == 200


async def test_a_body_on_a_path_that_only_ends_in_data_is_bound_as_a_control_body(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings, volume: None
) -> None:
    status, body = await raw_request(
        app,
        "PUT",
        "/v1/volumes/v/x/data",
        [bearer(settings), (b"content-length", str(512 * MiB).encode())],
    )
    assert status == 413
    assert b"REQCRYPT_MAX_CONTROL_BODY_BYTES" in body


async def test_a_content_length_of_thousands_of_digits_is_a_client_error_and_logs_nothing(
    app: FastAPI,
    client: httpx.AsyncClient,
    settings: Settings,
    volume: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    digits = b"0" * 4301 + b"9"
    with caplog.at_level(logging.WARNING):
        control, _ = await raw_request(
            app, "POST", "/v1/devices", [bearer(settings), (b"content-length", b"9" * 4302)]
        )
        data, _ = await raw_request(
            app,
            "PUT",
            "/v1/volumes/v/data",
            [
                bearer(settings),
                (b"content-range", b"bytes 0-8/*"),
                (b"content-length", digits),
            ],
            b"123456789",
        )
    assert control == 413
    assert data == 204
    assert caplog.records == []


async def test_a_multi_range_read_past_the_budget_is_a_503_and_passes_once_there_is_room(
    app: FastAPI, client: httpx.AsyncClient, volume: None
) -> None:
    budget = app.state.reqcrypt.budget
    ranges = {"Range": "bytes=0-2097151,4194304-6291455"}
    held = budget.take(7 * MiB, "another client")
    refused = await client.get("/v1/volumes/v/data", headers=ranges)
    assert refused.status_code == 503
    assert refused.headers["Retry-After"] == "1"
    assert "REQCRYPT_MAX_BUFFERED_BYTES" in refused.json()["detail"]
    budget.give(held)
    answered = await client.get("/v1/volumes/v/data", headers=ranges)
    assert answered.status_code == 206
    assert len(answered.content) > 4 * MiB


async def test_a_multipart_body_holds_what_has_arrived_not_what_it_declares(
    app: FastAPI, client: httpx.AsyncClient, volume: None
) -> None:
    budget = app.state.reqcrypt.budget
    arrived = asyncio.Event()
    more = asyncio.Event()
    length = 8 * MiB - 100
    head = f"--b\r\nContent-Range: bytes 0-{length - 1}/*\r\n\r\n".encode()
    tail = b"\r\n--b--\r\n"
    declared = len(head) + length + len(tail)

    async def trickle() -> AsyncIterator[bytes]:
        yield head
        arrived.set()
        await more.wait()
        yield b"z" * length
        yield tail

    put = asyncio.create_task(
        client.put(
            "/v1/volumes/v/data",
            content=trickle(),
            headers={
                "Content-Type": "multipart/byteranges; boundary=b",
                "Content-Length": str(declared),
            },
        )
    )
    await arrived.wait()
    await asyncio.sleep(0.05)
    assert budget.held <= 1 * MiB
    more.set()
    response = await put
    assert response.status_code == 204, response.text
    assert budget.held == 0


async def test_a_large_control_body_without_a_token_is_refused_before_it_is_read(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    read: list[bool] = []
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/devices",
        "raw_path": b"/v1/devices",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"test"), (b"content-length", str(512 << 10).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
        "app": app,
    }
    answer: dict[str, Any] = {}

    async def receive() -> dict[str, Any]:
        read.append(True)
        return {"type": "http.request", "body": b"x" * (512 << 10), "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]

    await app(scope, receive, send)
    assert answer["status"] == 401
    assert read == []


async def test_a_large_control_body_waits_for_the_budget_like_any_buffer(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings
) -> None:
    budget = app.state.reqcrypt.budget
    held = budget.take(8 * MiB - 1024, "another client")
    status, body = await raw_request(
        app,
        "POST",
        "/v1/devices",
        [bearer(settings), (b"content-length", str(256 << 10).encode())],
        b"{" + b" " * ((256 << 10) - 2) + b"}",
    )
    budget.give(held)
    assert status == 503
    assert b"REQCRYPT_MAX_BUFFERED_BYTES" in body
    assert budget.held == 0
