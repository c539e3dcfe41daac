from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openapi_spec_validator import validate
from opentelemetry import metrics, trace

from tests.support.factories import make_device, make_volume

pytestmark = pytest.mark.anyio


async def test_healthz_answers_without_a_token(anon_client: httpx.AsyncClient) -> None:
    response = await anon_client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_readyz_reports_database_migrations_and_data_dir(
    anon_client: httpx.AsyncClient,
) -> None:
    response = await anon_client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["checks"] == {"database": "ok", "migrations": "ok", "data_dir": "ok"}


async def test_metrics_expose_per_route_request_counters(anon_client: httpx.AsyncClient) -> None:
    await anon_client.get("/healthz")
    response = await anon_client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert 'reqcrypt_http_requests_total{method="GET",route="/healthz",status="200"}' in (
        response.text
    )


async def test_metrics_count_each_status_of_a_route_apart(
    anon_client: httpx.AsyncClient, client: httpx.AsyncClient
) -> None:
    for _ in range(2):
        assert (await anon_client.get("/v1/volumes")).status_code == 401
    assert (await client.get("/v1/volumes")).status_code == 200
    text = (await anon_client.get("/metrics")).text
    route = 'method="GET",route="/v1/volumes"'
    assert f'reqcrypt_http_requests_total{{{route},status="401"}} 2.0' in text
    assert f'reqcrypt_http_requests_total{{{route},status="200"}} 1.0' in text
    assert f"reqcrypt_http_request_duration_seconds_count{{{route}}} 3.0" in text


async def test_a_request_asks_no_opentelemetry_provider(
    anon_client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service exports its own metrics and sets up no OpenTelemetry: FastAPI's own
    telemetry is off rather than asking the global providers on every request."""
    asked: list[str] = []
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: asked.append("trace"))
    monkeypatch.setattr(metrics, "get_meter_provider", lambda: asked.append("metrics"))
    assert (await anon_client.get("/healthz")).status_code == 200
    assert asked == []


async def test_openapi_docs_are_served(anon_client: httpx.AsyncClient) -> None:
    assert (await anon_client.get("/docs")).status_code == 200
    assert (await anon_client.get("/openapi.json")).json()["info"]["title"] == "reqcrypt"


async def test_every_response_carries_a_request_id(anon_client: httpx.AsyncClient) -> None:
    response = await anon_client.get("/healthz", headers={"X-Request-ID": "abc-123"})
    assert response.headers["x-request-id"] == "abc-123"


async def test_generated_request_ids_are_128_bit_hex_and_distinct(
    anon_client: httpx.AsyncClient,
) -> None:
    ids = {(await anon_client.get("/healthz")).headers["x-request-id"] for _ in range(50)}
    assert len(ids) == 50
    assert all(len(value) == 32 and int(value, 16) >= 0 for value in ids)


async def test_the_data_routes_are_matched_before_the_control_plane(
    anon_client: httpx.AsyncClient,
) -> None:
    """The document lists paths in routing order, the order FastAPI tries them in."""
    paths = list((await anon_client.get("/openapi.json")).json()["paths"])
    assert paths[0] == "/v1/volumes/{name}/data"


async def test_the_docs_list_tags_control_plane_first(anon_client: httpx.AsyncClient) -> None:
    document = (await anon_client.get("/openapi.json")).json()
    assert [tag["name"] for tag in document["tags"]] == [
        "health",
        "devices",
        "volumes",
        "data",
        "benchmarks",
        "engines",
    ]


async def test_metrics_expose_volume_queue_and_engine_counters(client: httpx.AsyncClient) -> None:
    await make_device(client)
    await make_volume(client)
    await client.put(
        "/v1/volumes/vol/data", content=b"x" * 4096, headers={"Content-Range": "bytes 0-4095/*"}
    )
    text = (await client.get("/metrics")).text
    assert 'reqcrypt_volume_bios_total{group="w",volume="vol"} 1.0' in text
    assert 'reqcrypt_volume_engine_calls_total{volume="vol"} 1.0' in text
    assert 'reqcrypt_engine_calls_total{engine="software",kind="bulk"}' in text


async def test_openapi_document_is_valid_and_every_ref_resolves(
    anon_client: httpx.AsyncClient,
) -> None:
    document = (await anon_client.get("/openapi.json")).json()
    validate(document)
    for ref in refs(document):
        node = document
        for part in ref.removeprefix("#/").split("/"):
            node = node[part]
    problem = document["paths"]["/v1/devices/{name}"]["get"]["responses"]["404"]
    assert "application/problem+json" in problem["content"]


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from refs(item)
