import httpx
import jsonschema
import pytest
from fastapi import FastAPI

from app.api.schemas import DeviceCreate
from app.storage.registry import Placement
from tests.support.factories import make_device, make_volume

pytestmark = pytest.mark.anyio


async def test_unauthenticated_v1_call_is_a_401_problem(anon_client: httpx.AsyncClient) -> None:
    response = await anon_client.get("/v1/devices")
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["www-authenticate"] == "Bearer"


async def test_io_token_cannot_create_devices(io_client: httpx.AsyncClient) -> None:
    response = await io_client.post("/v1/devices", json={"name": "d", "size_bytes": 4096})
    assert response.status_code == 403


async def test_created_device_is_a_sparse_file_of_the_requested_size(
    client: httpx.AsyncClient,
) -> None:
    await make_device(client, "sda2", 64 << 20)
    body = (await client.get("/v1/devices/sda2")).json()
    assert body["size_bytes"] == 64 << 20
    assert body["allocated_bytes"] < 1 << 20
    assert body["mapped_by"] == []


@pytest.mark.parametrize("name", ["../x", "a/b", "", "x" * 65, ".."])
async def test_device_names_with_separators_or_bad_length_are_refused(
    client: httpx.AsyncClient, name: str
) -> None:
    response = await client.post("/v1/devices", json={"name": name, "size_bytes": 4096})
    assert response.status_code == 422


async def test_device_size_must_be_a_multiple_of_512(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/devices", json={"name": "d", "size_bytes": 1000})
    assert response.status_code == 422
    assert "multiple of 512" in response.json()["detail"]


async def test_duplicate_device_is_a_409(client: httpx.AsyncClient) -> None:
    await make_device(client, "d")
    response = await client.post("/v1/devices", json={"name": "d", "size_bytes": 4096})
    assert response.status_code == 409


async def test_mapped_device_cannot_be_deleted(client: httpx.AsyncClient) -> None:
    await make_device(client)
    await make_volume(client)
    response = await client.delete("/v1/devices/sda2")
    assert response.status_code == 409
    assert "vol" in response.json()["detail"]
    assert (await client.get("/v1/devices/sda2")).json()["mapped_by"] == ["vol"]


async def test_deleted_device_is_gone(client: httpx.AsyncClient) -> None:
    await make_device(client)
    assert (await client.delete("/v1/devices/sda2")).status_code == 204
    assert (await client.get("/v1/devices/sda2")).status_code == 404


async def test_a_failed_device_file_leaves_no_row_and_a_retry_works(
    client: httpx.AsyncClient, app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    control = app.state.reqcrypt.control

    def disk_full(name: str, size: int, placement: Placement) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(control.devices, "create", disk_full)
    with pytest.raises(OSError, match="No space"):
        control.create_device("d", 4096, None)
    monkeypatch.undo()
    assert (await client.get("/v1/devices/d")).status_code == 404
    await make_device(client, "d", 4096)


@pytest.mark.parametrize(
    ("extra", "status"),
    [
        ({}, 201),
        ({"pool": None}, 201),
        ({"store": "file", "pool": None}, 201),
        ({"pool": "rbd"}, 422),
        ({"store": "file", "pool": "rbd"}, 422),
    ],
)
async def test_the_schema_says_what_is_enforced_of_store_and_pool(
    client: httpx.AsyncClient, extra: dict[str, object], status: int
) -> None:
    """A pool needs "store": "rbd": the published schema (if/then) and the service agree."""
    body = {"name": "d", "size_bytes": 4096, **extra}
    schema = DeviceCreate.model_json_schema()
    response = await client.post("/v1/devices", json=body)
    assert response.status_code == status
    assert jsonschema.Draft202012Validator(schema).is_valid(body) == (status == 201)
