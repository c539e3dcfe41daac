"""Rules and state-dependent answers the document states, so a client (or a fuzzer)
reads them instead of discovering them."""

from __future__ import annotations

from typing import Any

import httpx
import jsonschema
import pytest

pytestmark = pytest.mark.anyio

DATA_OPERATIONS = [
    ("get", "/v1/volumes/{name}/data"),
    ("head", "/v1/volumes/{name}/data"),
    ("put", "/v1/volumes/{name}/data"),
    ("post", "/v1/volumes/{name}/flush"),
    ("post", "/v1/volumes/{name}/discard"),
    ("post", "/v1/volumes/{name}/write-zeroes"),
]


async def document(client: httpx.AsyncClient) -> dict[str, Any]:
    schema: dict[str, Any] = (await client.get("/openapi.json")).json()
    return schema


async def test_an_engine_deriving_essiv_without_keyed_iv_is_outside_the_document(
    anon_client: httpx.AsyncClient,
) -> None:
    schema = await document(anon_client)
    capabilities = {**schema["components"]["schemas"]["Capabilities-Input"], "components": {}}
    jsonschema.validate({"bulk_ivmodes": ["essiv"], "keyed_iv": True}, capabilities)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"bulk_ivmodes": ["essiv"]}, capabilities)


@pytest.mark.parametrize(("method", "path"), DATA_OPERATIONS)
async def test_io_to_a_suspended_volume_documents_its_wait_and_retry_after(
    anon_client: httpx.AsyncClient, method: str, path: str
) -> None:
    answer = (await document(anon_client))["paths"][path][method]["responses"]["503"]
    assert "REQCRYPT_SUSPEND_WAIT_SECONDS" in answer["description"]
    assert "Retry-After" in answer["headers"]


@pytest.mark.parametrize("method", ["get", "head", "put"])
async def test_a_stale_etag_and_a_range_outside_the_volume_are_documented(
    anon_client: httpx.AsyncClient, method: str
) -> None:
    responses = (await document(anon_client))["paths"]["/v1/volumes/{name}/data"][method][
        "responses"
    ]
    assert "If-Match" in responses["412"]["description"]
    assert "outside the volume" in responses["416"]["description"]
