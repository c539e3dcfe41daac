"""``/metrics`` names every volume, node and engine in its labels: open by default (the
Prometheus convention), behind the io or admin token under REQCRYPT_METRICS_AUTH=io."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from app.config import Settings
from tests.support.app import ADMIN_TOKEN, IO_TOKEN, asgi_client, started

pytestmark = pytest.mark.anyio


@pytest.fixture
async def guarded_app(settings: Settings) -> AsyncIterator[FastAPI]:
    async with started(settings.model_copy(update={"metrics_auth": "io"})) as application:
        yield application


async def scrape(app: FastAPI, token: str | None) -> httpx.Response:
    async with asgi_client(app, token) as client:
        return await client.get("/metrics")


async def test_metrics_auth_io_refuses_a_scrape_without_a_valid_token(
    guarded_app: FastAPI,
) -> None:
    for token in (None, "not-a-token-of-this-service"):
        response = await scrape(guarded_app, token)
        assert response.status_code == 401, token
        assert response.headers["content-type"] == "application/problem+json"
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert "reqcrypt_" not in response.text


async def test_metrics_auth_io_serves_the_io_and_the_admin_token(guarded_app: FastAPI) -> None:
    for token in (IO_TOKEN, ADMIN_TOKEN):
        response = await scrape(guarded_app, token)
        assert response.status_code == 200
        assert "reqcrypt_http_requests_total" in response.text


async def test_metrics_are_open_without_a_token_by_default(anon_client: httpx.AsyncClient) -> None:
    response = await anon_client.get("/metrics")
    assert response.status_code == 200
    assert "reqcrypt_http_requests_total" in response.text


async def test_the_document_says_metrics_may_need_a_bearer_token(
    anon_client: httpx.AsyncClient,
) -> None:
    operation = (await anon_client.get("/openapi.json")).json()["paths"]["/metrics"]["get"]
    assert operation["security"] == [{}, {"HTTPBearer": []}]
    assert "REQCRYPT_METRICS_AUTH=io" in operation["responses"]["401"]["description"]
    assert "application/problem+json" in operation["responses"]["401"]["content"]
    assert "REQCRYPT_METRICS_AUTH=io" in operation["description"]
