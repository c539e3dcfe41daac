import httpx
import pytest

from app.engine.model import Capabilities
from tests.support.factories import make_device, make_volume
from tests.support.keys import CBC_KEY, XTS_KEY

pytestmark = pytest.mark.anyio

COST = {"setup_ns": 1000, "encrypt_bytes_per_s": 1e8, "decrypt_bytes_per_s": 1e8}


async def test_presets_are_listed(client: httpx.AsyncClient) -> None:
    names = {engine["name"] for engine in (await client.get("/v1/engines")).json()}
    assert {"software", "omap-aes-am335x", "mv-cesa"} <= names


async def test_engine_shows_capabilities_cost_and_live_stats(client: httpx.AsyncClient) -> None:
    body = (await client.get("/v1/engines/omap-aes-am335x")).json()
    assert body["capabilities"]["max_bytes_per_call"] > 0
    assert body["cost"]["setup_ns"] > 0
    assert "calls" in body["stats"]


async def test_unknown_engine_is_404(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/engines/nope")).status_code == 404


@pytest.mark.parametrize(
    ("capabilities", "location"),
    [
        ({"max_bytes_per_call": 1}, "capabilities.max_bytes_per_call"),
        ({"max_bytes_per_call": 1000}, "capabilities.max_bytes_per_call"),
        ({"channels": "2"}, "capabilities.channels"),
        ({"ciphers": []}, "capabilities.ciphers"),
        ({"data_unit_sizes": [768]}, "capabilities.data_unit_sizes"),
        ({"lanes": 2}, "capabilities.lanes"),
    ],
)
async def test_custom_engine_field_errors_are_problems(
    client: httpx.AsyncClient, capabilities: dict[str, object], location: str
) -> None:
    response = await client.post(
        "/v1/engines", json={"name": "bad", "capabilities": capabilities, "cost": COST}
    )
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    assert location in response.json()["detail"]


async def test_custom_engine_omissions_take_the_models_defaults(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/engines", json={"name": "plain", "capabilities": {}, "cost": COST}
    )
    assert response.status_code == 201, response.text
    assert response.json()["capabilities"] == Capabilities().to_dict()
    assert response.json()["cost"]["segment_ns"] == 0.0
    assert (await client.get("/v1/engines/plain")).json()["capabilities"][
        "max_segments_per_call"
    ] == 256


async def test_custom_engine_rules_between_fields_are_problems(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/engines",
        json={"name": "keyless", "capabilities": {"bulk_ivmodes": ["essiv"]}, "cost": COST},
    )
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    assert "keyed_iv" in response.json()["detail"]
    assert (await client.get("/v1/engines/keyless")).status_code == 404


async def test_openapi_documents_the_models_defaults_and_limits(client: httpx.AsyncClient) -> None:
    schemas = (await client.get("/openapi.json")).json()["components"]["schemas"]
    caps = next(schema for name, schema in schemas.items() if name.startswith("Capabilities"))
    assert caps["properties"]["max_segments_per_call"]["default"] == 256
    assert caps["properties"]["max_bytes_per_call"]["multipleOf"] == 512
    assert caps["additionalProperties"] is False
    assert any(name.startswith("EngineView") for name in schemas)


async def test_custom_engine_and_device_model_drive_a_volume(client: httpx.AsyncClient) -> None:
    created = await client.post(
        "/v1/engines",
        json={
            "name": "slow",
            "capabilities": {"chainmodes": ["xts"], "bulk_ivmodes": ["plain64"]},
            "cost": {"setup_ns": 5000, "encrypt_bytes_per_s": 5e7, "decrypt_bytes_per_s": 5e7},
        },
    )
    assert created.status_code == 201, created.text
    model = await client.post(
        "/v1/device-models",
        json={"name": "disk", "read_latency_ns": 100000, "write_latency_ns": 100000},
    )
    assert model.status_code == 201, model.text
    response = await client.post(
        "/v1/devices", json={"name": "sda2", "size_bytes": 1 << 20, "model": "disk"}
    )
    assert response.status_code == 201
    await make_volume(client, engine="slow")
    await client.put(
        "/v1/volumes/vol/data", content=b"x" * 4096, headers={"Content-Range": "bytes 0-4095/*"}
    )
    engine = (await client.get("/v1/engines/slow")).json()
    assert engine["stats"]["calls"]["bulk"] >= 1
    disk = (await client.get("/v1/device-models/disk")).json()
    assert disk["stats"]["ios"]["write"] >= 1


async def test_volume_engine_is_switched_by_patch(client: httpx.AsyncClient) -> None:
    await make_device(client)
    await make_volume(client, table=f"0 2048 crypt aes-cbc-essiv:sha256 {CBC_KEY} 0 sda2 0")
    response = await client.patch("/v1/volumes/vol", json={"engine": "mv-cesa"})
    assert response.status_code == 200
    assert response.json()["engine"] == "mv-cesa"


async def test_engine_that_cannot_run_the_table_is_refused(client: httpx.AsyncClient) -> None:
    await make_device(client)
    await make_volume(client, table=f"0 2048 crypt aes-xts-plain64 {XTS_KEY} 0 sda2 0")
    response = await client.patch("/v1/volumes/vol", json={"engine": "mv-cesa"})
    assert response.status_code == 422
    assert (await client.get("/v1/volumes/vol")).json()["engine"] == "software"


async def test_device_model_with_a_write_buffer_is_accepted_and_half_of_one_refused(
    client: httpx.AsyncClient,
):
    card = {
        "name": "slc-card",
        "write_bytes_per_s": 4.5e8,
        "write_buffer_bytes": 1 << 30,
        "write_sustained_bytes_per_s": 1.2e8,
    }
    response = await client.post("/v1/device-models", json=card)
    assert response.status_code == 201, response.text
    assert response.json()["write_buffer_bytes"] == 1 << 30
    half = {"name": "half-card", "write_buffer_bytes": 1 << 30}
    response = await client.post("/v1/device-models", json=half)
    assert response.status_code == 422
    assert "go together" in response.json()["detail"]
