"""The ``/v1/null`` ceiling endpoints: absent from the production API, mounted for benchmarks."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from app.config import Settings
from app.main import create_app
from tests.support.app import ADMIN_TOKEN, asgi_client

pytestmark = pytest.mark.anyio


@pytest.fixture
async def bench_client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.model_copy(update={"bench_ceiling": True}))
    async with app.router.lifespan_context(app), asgi_client(app, ADMIN_TOKEN) as client:
        yield client


async def test_ceiling_endpoints_are_absent_by_default(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/null/data")).status_code == 404
    assert (await client.put("/v1/null/data", content=b"x" * 512)).status_code == 404
    paths = (await client.get("/openapi.json")).json()["paths"]
    assert not [path for path in paths if path.startswith("/v1/null")]


async def test_the_ceiling_is_routed_right_after_the_volume_data_path(
    bench_client: httpx.AsyncClient,
) -> None:
    paths = list((await bench_client.get("/openapi.json")).json()["paths"])
    assert paths.index("/v1/null/data") < paths.index("/healthz")


async def test_ceiling_write_consumes_the_body(bench_client: httpx.AsyncClient) -> None:
    response = await bench_client.put("/v1/null/data", content=b"x" * 4096)
    assert response.status_code == 204


async def test_ceiling_endpoint_refuses_a_negative_size(bench_client: httpx.AsyncClient) -> None:
    response = await bench_client.get("/v1/null/data", params={"size": -327})
    assert response.status_code == 422


async def test_ceiling_endpoint_streams_large_reads(bench_client: httpx.AsyncClient) -> None:
    response = await bench_client.get("/v1/null/data", params={"size": 3 << 20})
    assert response.status_code == 206
    assert response.headers["content-range"] == f"bytes 0-{(3 << 20) - 1}/{3 << 20}"
    assert response.content == bytes(3 << 20)
