"""The OpenAPI document is a manual: every operation explained, with examples and its errors."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from openapi_spec_validator import validate

from app.api.manual import OPERATIONS

pytestmark = pytest.mark.anyio


async def document(client: httpx.AsyncClient) -> dict[str, Any]:
    schema: dict[str, Any] = (await client.get("/openapi.json")).json()
    return schema


def operations(schema: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method, path): operation
        for path, methods in schema["paths"].items()
        for method, operation in methods.items()
    }


async def test_the_manual_covers_exactly_the_operations(anon_client: httpx.AsyncClient) -> None:
    assert set(operations(await document(anon_client))) == set(OPERATIONS)


async def test_every_operation_has_a_summary_and_a_description(
    anon_client: httpx.AsyncClient,
) -> None:
    schema = await document(anon_client)
    validate(schema)
    for key, operation in operations(schema).items():
        assert operation["summary"] == OPERATIONS[key]["summary"], key
        assert len(operation["description"]) > 20, key


async def test_every_request_body_has_examples(anon_client: httpx.AsyncClient) -> None:
    for key, operation in operations(await document(anon_client)).items():
        for media, content in operation.get("requestBody", {}).get("content", {}).items():
            assert content.get("examples"), (key, media)


async def test_every_v1_operation_documents_its_problem_responses(
    anon_client: httpx.AsyncClient,
) -> None:
    for (method, path), operation in operations(await document(anon_client)).items():
        if not path.startswith("/v1/"):
            continue
        errors = {status for status in operation["responses"] if status >= "400"}
        assert "401" in errors, (method, path)
        for status in errors:
            content = operation["responses"][status]["content"]
            assert "application/problem+json" in content, (method, path, status)


async def test_the_data_headers_are_documented_with_examples(
    anon_client: httpx.AsyncClient,
) -> None:
    ops = operations(await document(anon_client))

    def headers(method: str) -> dict[str, dict[str, Any]]:
        parameters = ops[(method, "/v1/volumes/{name}/data")]["parameters"]
        return {p["name"]: p for p in parameters if p["in"] == "header"}

    read = headers("get")
    assert {"Range", "If-Match", "If-None-Match", "If-Range"} <= set(read)
    assert "bytes=0-511,4096-4607" in json.dumps(read["Range"]["examples"])
    write = headers("put")
    assert write["Content-Range"]["required"] is True
    assert write["Content-Range"]["example"] == "bytes 0-4095/*"
    assert (
        "multipart/byteranges"
        in ops[("get", "/v1/volumes/{name}/data")]["responses"]["206"]["content"]
    )


async def test_readiness_documents_its_503(anon_client: httpx.AsyncClient) -> None:
    ops = operations(await document(anon_client))
    assert "503" in ops[("get", "/readyz")]["responses"]
