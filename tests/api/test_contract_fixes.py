"""What the OpenAPI document promises, request by request: each test one rule the
contract test (tests/contract) found the service and its document disagreeing on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from app.config import Settings
from app.main import create_app
from tests.support.factories import make_device, make_volume, xts_table

pytestmark = pytest.mark.anyio

PYDANTIC_ONLY = {"ge", "le", "gt", "lt", "multiple_of", "min_length", "max_length"}


async def document(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/openapi.json")
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


async def test_an_integral_float_is_an_integer(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/devices", json={"name": "d", "size_bytes": 4096.0})
    assert response.status_code == 201, response.text
    assert response.json()["size_bytes"] == 4096


async def test_a_fractional_float_is_not_an_integer(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/devices", json={"name": "d", "size_bytes": 4096.5})
    assert response.status_code == 422
    assert (await client.get("/v1/devices/d")).status_code == 404


async def test_an_empty_table_is_refused_by_the_schema(client: httpx.AsyncClient) -> None:
    await make_device(client)
    response = await client.post("/v1/volumes", json={"name": "v", "table": ""})
    assert response.status_code == 422
    assert response.json()["errors"][0]["loc"] == ["body", "table"]


async def test_a_blank_json_table_load_is_refused_by_the_schema(
    client: httpx.AsyncClient,
) -> None:
    await make_device(client)
    await make_volume(client)
    response = await client.put("/v1/volumes/vol/table", json={"table": " "})
    assert response.status_code == 422
    assert response.json()["errors"][0]["loc"] == ["body", "table"]


async def test_a_json_table_load_with_an_unknown_field_is_refused(
    client: httpx.AsyncClient,
) -> None:
    await make_device(client)
    await make_volume(client)
    body = {"table": xts_table(), "extra": 1}
    response = await client.put("/v1/volumes/vol/table", json=body)
    assert response.status_code == 422
    assert response.json()["errors"][0]["loc"] == ["body", "extra"]


async def test_nomerges_refuses_a_bool(client: httpx.AsyncClient) -> None:
    await make_device(client)
    await make_volume(client)
    response = await client.patch("/v1/volumes/vol", json={"queue_limits": {"nomerges": False}})
    assert response.status_code == 422


async def test_plug_window_refuses_a_negative_value(client: httpx.AsyncClient) -> None:
    await make_device(client)
    await make_volume(client)
    response = await client.patch("/v1/volumes/vol", json={"plug_window_us": -1})
    assert response.status_code == 422


async def test_a_message_outside_crypt_grammar_is_refused_by_the_schema(
    client: httpx.AsyncClient,
) -> None:
    await make_device(client)
    await make_volume(client)
    response = await client.post("/v1/volumes/vol/message", json={"message": ""})
    assert response.status_code == 422
    assert response.json()["errors"][0]["loc"] == ["body", "message"]


async def test_the_document_uses_json_schema_words_only(client: httpx.AsyncClient) -> None:
    found: list[str] = []

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in PYDANTIC_ONLY and not path.endswith("/properties"):
                    found.append(f"{path}/{key}")
                walk(value, f"{path}/{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{path}/{index}")

    walk(await document(client), "")
    assert found == []


async def test_the_benchmark_template_example_is_accepted(client: httpx.AsyncClient) -> None:
    schemas = (await document(client))["components"]["schemas"]
    table = schemas["VolumeTemplateIn"]["properties"]["table"]["examples"][0]
    response = await client.post(
        "/v1/benchmarks",
        json={"volume_template": {"table": table}, "workload": {"size": 4096, "bs": 4096}},
    )
    assert response.status_code == 202, response.text


async def test_engine_requests_say_measured_is_false_only(client: httpx.AsyncClient) -> None:
    schemas = (await document(client))["components"]["schemas"]
    request = next(schemas[n] for n in ("EngineProfile-Input", "EngineProfile") if n in schemas)
    assert request["properties"]["measured"]["const"] is False


async def test_device_size_bound_is_the_configured_one(settings: Settings) -> None:
    app = create_app(settings.model_copy(update={"max_device_bytes": 1 << 30}))
    properties = app.openapi()["components"]["schemas"]["DeviceCreate"]["properties"]
    assert properties["size_bytes"]["maximum"] == 1 << 30


async def test_the_rbd_store_is_offered_only_with_a_ceph_conf(settings: Settings) -> None:
    without = create_app(settings.model_copy(update={"ceph_conf": None}))
    with_ceph = create_app(settings.model_copy(update={"ceph_conf": Path("/etc/ceph/ceph.conf")}))
    store = "components", "schemas", "DeviceCreate", "properties", "store"
    assert dig(without.openapi(), store)["enum"] == ["file"]
    assert dig(with_ceph.openapi(), store)["enum"] == ["file", "rbd"]


def dig(document: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    for key in keys:
        document = document[key]
    return document


async def test_an_unknown_device_model_is_a_documented_404(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/devices", json={"name": "d", "size_bytes": 4096, "model": "no-such-model"}
    )
    assert response.status_code == 404
    operation = (await document(client))["paths"]["/v1/devices"]["post"]
    assert "404" in operation["responses"]


async def test_volume_links_reach_the_data_path(client: httpx.AsyncClient) -> None:
    operation = (await document(client))["paths"]["/v1/volumes"]["post"]
    links = operation["responses"]["201"]["links"]
    assert links["Read"]["parameters"] == {"name": "$response.body#/name"}
    assert links["Write"]["operationId"].startswith("write_data")
