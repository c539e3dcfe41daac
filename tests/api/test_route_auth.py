"""Every route of the app, enumerated from the app itself, authenticates as specified:
no token -> 401 with WWW-Authenticate; the io token on an admin route -> 403 naming the
admin scope. A new route is admin-only unless listed here, so forgetting auth fails."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.routing import Mount

from app.api import deps
from app.config import Settings
from app.main import create_app
from tests.support.app import ADMIN_TOKEN, IO_TOKEN, asgi_client
from tests.support.factories import make_device, make_volume

pytestmark = pytest.mark.anyio

PUBLIC = {
    ("GET", "/healthz"),
    ("GET", "/readyz"),  # probes: no token in a kubelet
    ("GET", "/metrics"),  # Prometheus scrapes without a token (by default)
    ("GET", "/openapi.json"),
    ("HEAD", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/redoc"),
}
PUBLIC_MOUNTS = {"/docs/assets"}
OPTIONAL_TOKEN = {("GET", "/metrics")}
"""Public unless a setting asks for a token (REQCRYPT_METRICS_AUTH=io): the document
offers both, no token or a bearer token."""
IO_WRITES = {
    ("PUT", "/v1/volumes/{name}/data"),
    ("POST", "/v1/volumes/{name}/flush"),
    ("POST", "/v1/volumes/{name}/discard"),
    ("POST", "/v1/volumes/{name}/write-zeroes"),
    ("PUT", "/v1/null/data"),
}
"""The data path: the io token's whole purpose. Every other non-GET route is admin only."""
ADMIN_READS = {("GET", "/v1/volumes/{name}/trace")}
"""Reads the io token may not make: a block trace shows every client's I/O on the volume."""


def endpoints(app: FastAPI) -> Iterator[tuple[str, str]]:
    """(method, path) of every route the app serves, through included routers too."""
    for route in app.routes:
        contexts = getattr(route, "effective_route_contexts", None)
        for leaf in contexts() if contexts is not None else [route]:
            if isinstance(leaf, Mount):
                assert leaf.path in PUBLIC_MOUNTS, f"unexpected mount {leaf.path}"
                continue
            for method in sorted(leaf.methods or ()):
                yield method, leaf.path


def concrete(path: str) -> str:
    return path.replace("{name}", "nosuch").replace("{run_id}", "nosuch")


@pytest.fixture
async def full_app(settings: Settings) -> AsyncIterator[FastAPI]:
    """The app with every optional router on."""
    application = create_app(settings.model_copy(update={"bench_ceiling": True}))
    async with application.router.lifespan_context(application):
        yield application


async def call(app: FastAPI, token: str | None, method: str, path: str) -> httpx.Response:
    async with asgi_client(app, token) as client:
        return await client.request(method, concrete(path))


def assert_unauthenticated(response: httpx.Response, what: str) -> None:
    assert response.status_code == 401, what
    assert response.headers["www-authenticate"].startswith("Bearer"), what
    assert response.headers["content-type"] == "application/problem+json", what


async def test_the_route_list_is_the_whole_app(full_app: FastAPI) -> None:
    found = set(endpoints(full_app))
    assert found >= PUBLIC
    assert found >= IO_WRITES
    assert ("PUT", "/v1/volumes/{name}/table") in found
    assert len(found) > 40


async def test_every_non_public_route_needs_a_bearer_token(full_app: FastAPI) -> None:
    for method, path in endpoints(full_app):
        if (method, path) in PUBLIC:
            continue
        what = f"{method} {path}"
        assert_unauthenticated(await call(full_app, None, method, path), what)
        assert_unauthenticated(
            await call(full_app, "not-a-token-of-this-service", method, path), what
        )


async def test_public_routes_answer_without_a_token(full_app: FastAPI) -> None:
    for method, path in PUBLIC:
        response = await call(full_app, None, method, path)
        assert response.status_code == 200, f"{method} {path}"


async def test_the_io_token_reads_and_does_data_io_but_reaches_no_admin_route(
    full_app: FastAPI,
) -> None:
    for method, path in endpoints(full_app):
        if (method, path) in PUBLIC:
            continue
        what = f"{method} {path}"
        response = await call(full_app, IO_TOKEN, method, path)
        readable = method in ("GET", "HEAD") and (method, path) not in ADMIN_READS
        if readable or (method, path) in IO_WRITES:
            assert response.status_code not in (401, 403), what
            continue
        assert response.status_code == 403, what
        problem: dict[str, Any] = response.json()
        assert "needs the admin token (scope 'admin')" in problem["detail"], what
        assert 'error="insufficient_scope"' in response.headers["www-authenticate"], what


async def test_the_admin_token_reaches_every_route(full_app: FastAPI) -> None:
    for method, path in endpoints(full_app):
        response = await call(full_app, ADMIN_TOKEN, method, path)
        assert response.status_code not in (401, 403), f"{method} {path}"


async def test_the_io_token_cannot_see_keys(
    client: httpx.AsyncClient, io_client: httpx.AsyncClient
) -> None:
    await make_device(client)
    await make_volume(client)
    shown = await io_client.get("/v1/volumes/vol/table", params={"show_keys": "true"})
    assert shown.status_code == 403
    assert shown.json()["detail"].startswith("show_keys needs the admin token (scope 'admin')")
    hidden = await io_client.get("/v1/volumes/vol/table")
    assert hidden.status_code == 200


async def test_the_io_token_cannot_load_a_table_create_or_delete(
    client: httpx.AsyncClient, io_client: httpx.AsyncClient
) -> None:
    await make_device(client)
    await make_volume(client)
    attempts = [
        io_client.put("/v1/volumes/vol/table", content="0 2048 zero"),
        io_client.post("/v1/devices", json={"name": "other", "size_bytes": 1 << 20}),
        io_client.post("/v1/volumes", json={"name": "v2", "table": "0 8 zero"}),
        io_client.delete("/v1/volumes/vol"),
        io_client.delete("/v1/devices/sda2"),
    ]
    for attempt in attempts:
        assert (await attempt).status_code == 403
    info = (await client.get("/v1/volumes/vol")).json()
    assert info["tables"] == ["LIVE"]
    assert [d["name"] for d in (await client.get("/v1/devices")).json()] == ["sda2"]
    assert [v["name"] for v in (await client.get("/v1/volumes")).json()] == ["vol"]


def test_tokens_are_compared_in_constant_time(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decision is compare_digest's: with it answering "no", even the right token fails."""
    compared: list[tuple[bytes, bytes]] = []

    def refusing(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return False

    state: Any = type(
        "S", (), {"settings": settings, "admin_token": ADMIN_TOKEN, "io_token": IO_TOKEN}
    )
    assert deps.authorize(state, f"Bearer {IO_TOKEN}") == "io"
    monkeypatch.setattr(hmac, "compare_digest", refusing)
    with pytest.raises(Exception, match="invalid bearer token"):
        deps.authorize(state, f"Bearer {ADMIN_TOKEN}")
    assert (ADMIN_TOKEN.encode(), ADMIN_TOKEN.encode()) in compared
    assert (ADMIN_TOKEN.encode(), IO_TOKEN.encode()) in compared


async def test_the_openapi_schema_declares_bearer_auth_on_every_non_public_operation(
    full_app: FastAPI,
) -> None:
    schema = full_app.openapi()
    assert "HTTPBearer" in schema["components"]["securitySchemes"]
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            if (method.upper(), path) in OPTIONAL_TOKEN:
                assert operation["security"] == [{}, {"HTTPBearer": []}], f"{method} {path}"
                continue
            if (method.upper(), path) in PUBLIC:
                assert "security" not in operation, f"{method} {path}"
                continue
            assert operation.get("security") == [{"HTTPBearer": []}], f"{method} {path}"
