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


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("OPTIONS", "/v1/volumes", "GET, POST"),
        ("DELETE", "/v1/volumes", "GET, POST"),
        ("OPTIONS", "/v1/volumes/vol/data", "GET, HEAD, PUT"),
        ("POST", "/v1/volumes/vol/table", "GET, PUT, DELETE"),
    ],
)
async def test_405_names_every_method_the_path_serves(
    client: httpx.AsyncClient, method: str, path: str, allow: str
) -> None:
    response = await client.request(method, path)
    assert response.status_code == 405
    assert response.headers["allow"] == allow
    assert response.headers["content-type"] == "application/problem+json"
