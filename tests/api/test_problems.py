"""Every error is application/problem+json, FastAPI's own included."""

import httpx
import pytest
from fastapi import FastAPI

pytestmark = pytest.mark.anyio


def assert_problem(response: httpx.Response, status: int) -> dict[str, object]:
    assert response.status_code == status
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, object] = response.json()
    assert {"type", "title", "status", "detail"} <= body.keys()
    assert body["status"] == status
    return body


async def test_unknown_route_is_a_404_problem(client: httpx.AsyncClient) -> None:
    assert_problem(await client.get("/no/such/thing"), 404)


async def test_wrong_method_is_a_405_problem(client: httpx.AsyncClient) -> None:
    assert_problem(await client.delete("/healthz"), 405)


async def test_unhandled_exception_is_a_500_without_internals(app: FastAPI) -> None:
    secret = "s3cr3t-internal-detail"

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError(secret)

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        response = await http.get("/boom")
    body = assert_problem(response, 500)
    assert secret not in response.text
    assert response.headers["x-request-id"] in str(body["detail"])
