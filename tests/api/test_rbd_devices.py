"""Devices in RBD images, over HTTP, on the throwaway Ceph cluster of ``tests/support/ceph.py``."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from app.config import Settings
from app.storage.rbd import CephCluster, RbdStore
from tests.support import ceph
from tests.support.app import ADMIN_TOKEN, running
from tests.support.factories import make_volume, xts_table

pytestmark = [pytest.mark.anyio, pytest.mark.ceph]

SIZE = 4 << 20


@pytest.fixture
def prefix() -> str:
    """Image names of one test, apart from every other test's in the shared pool."""
    return f"t{uuid.uuid4().hex[:8]}-"


@pytest.fixture
def rbd_settings(data_dir: Path, ceph_cluster: ceph.Cluster, prefix: str) -> Settings:
    return Settings(
        data_dir=data_dir,
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
        ceph_conf=ceph_cluster.conf,
        rbd_image_prefix=prefix,
    )


@pytest.fixture
async def rbd_client(
    rbd_settings: Settings, ceph_cluster: ceph.Cluster, prefix: str
) -> AsyncIterator[httpx.AsyncClient]:
    async with running(rbd_settings) as client:
        yield client
    for image in ceph_cluster.images():
        if image.startswith(prefix):
            ceph_cluster.run("rbd", "rm", f"{ceph.POOL}/{image}")


async def make_rbd_device(client: httpx.AsyncClient, name: str, **fields: object) -> httpx.Response:
    return await client.post(
        "/v1/devices", json={"name": name, "size_bytes": SIZE, "store": "rbd", **fields}
    )


async def test_an_rbd_device_is_an_image_in_its_pool(
    rbd_client: httpx.AsyncClient, ceph_cluster: ceph.Cluster, prefix: str
) -> None:
    response = await make_rbd_device(rbd_client, "rbd0", pool="rbd")
    assert response.status_code == 201, response.text
    body = response.json()
    assert (body["store"], body["pool"], body["image"]) == ("rbd", "rbd", f"{prefix}rbd0")
    assert body["size_bytes"] == SIZE
    assert f"{prefix}rbd0" in ceph_cluster.images()
    listed = (await rbd_client.get("/v1/devices")).json()
    assert [(device["name"], device["store"]) for device in listed] == [("rbd0", "rbd")]


async def test_the_pool_defaults_to_rbd_and_a_file_device_has_none(
    rbd_client: httpx.AsyncClient,
) -> None:
    assert (await make_rbd_device(rbd_client, "r")).json()["pool"] == "rbd"
    file_device = await rbd_client.post("/v1/devices", json={"name": "f", "size_bytes": SIZE})
    assert (file_device.json()["store"], file_device.json()["pool"]) == ("file", None)


async def test_xts_ciphertext_in_the_image_is_the_file_devices_byte_for_byte(
    rbd_client: httpx.AsyncClient, ceph_cluster: ceph.Cluster, data_dir: Path, prefix: str
) -> None:
    """The same table over an RBD image and over a file: the same ciphertext lands."""
    assert (await make_rbd_device(rbd_client, "rbd0")).status_code == 201
    file_device = await rbd_client.post("/v1/devices", json={"name": "sda2", "size_bytes": SIZE})
    assert file_device.status_code == 201
    sectors = SIZE // 512
    await make_volume(rbd_client, "on-rbd", xts_table("rbd0", sectors))
    await make_volume(rbd_client, "on-file", xts_table("sda2", sectors))
    payload = os.urandom(256 << 10)
    for volume in ("on-rbd", "on-file"):
        for start in (0, 1 << 20):  # a plain write and one that spans an RBD object boundary
            put = await rbd_client.put(
                f"/v1/volumes/{volume}/data",
                content=payload,
                headers={
                    "Content-Range": f"bytes {start + 4096 - 100}-{start + 4096 + len(payload) - 101}/*"
                },
            )
            assert put.status_code == 204, put.text
        assert (await rbd_client.post(f"/v1/volumes/{volume}/flush")).status_code == 204
    got = await rbd_client.get(
        "/v1/volumes/on-rbd/data", headers={"Range": f"bytes=3996-{3996 + len(payload) - 1}"}
    )
    assert got.content == payload
    image = ceph_cluster.export(f"{prefix}rbd0")
    file_bytes = (data_dir / "devices" / "sda2.img").read_bytes()
    assert len(image) == len(file_bytes) == SIZE
    assert image == file_bytes
    assert payload[:4096] not in image  # ciphertext, not plaintext


async def test_an_rbd_device_is_not_deleted_while_mapped_then_its_image_goes(
    rbd_client: httpx.AsyncClient, ceph_cluster: ceph.Cluster, prefix: str
) -> None:
    await make_rbd_device(rbd_client, "rbd0")
    await make_volume(rbd_client, "vol", xts_table("rbd0", 2048))
    refused = await rbd_client.delete("/v1/devices/rbd0")
    assert refused.status_code == 409
    assert "vol" in refused.json()["detail"]
    assert f"{prefix}rbd0" in ceph_cluster.images()
    assert (await rbd_client.delete("/v1/volumes/vol")).status_code == 204
    assert (await rbd_client.delete("/v1/devices/rbd0")).status_code == 204
    assert f"{prefix}rbd0" not in ceph_cluster.images()
    assert (await rbd_client.get("/v1/devices/rbd0")).status_code == 404


async def test_an_rbd_device_open_by_another_client_is_not_deleted(
    rbd_client: httpx.AsyncClient, ceph_cluster: ceph.Cluster, prefix: str
) -> None:
    await make_rbd_device(rbd_client, "rbd0")
    other = CephCluster(ceph_cluster.conf)
    try:
        held = RbdStore(other.ioctx(ceph.POOL), f"{prefix}rbd0", SIZE)
        refused = await rbd_client.delete("/v1/devices/rbd0")
        assert refused.status_code == 409
        assert "open by another client" in refused.json()["detail"]
        assert (await rbd_client.get("/v1/devices/rbd0")).status_code == 200
        held.close()
    finally:
        other.close()
    assert (await rbd_client.delete("/v1/devices/rbd0")).status_code == 204
    assert f"{prefix}rbd0" not in ceph_cluster.images()


async def test_a_restart_reopens_the_image_with_its_data(
    rbd_settings: Settings, ceph_cluster: ceph.Cluster, prefix: str
) -> None:
    payload = os.urandom(8192)
    try:
        async with running(rbd_settings) as client:
            await make_rbd_device(client, "rbd0")
            await make_volume(client, "vol", xts_table("rbd0", 2048))
            put = await client.put(
                "/v1/volumes/vol/data", content=payload, headers={"Content-Range": "bytes 0-8191/*"}
            )
            assert put.status_code == 204
            before = (await client.get("/v1/devices/rbd0")).json()
        async with running(rbd_settings) as client:
            assert (await client.get("/v1/devices/rbd0")).json() == before
            got = await client.get("/v1/volumes/vol/data", headers={"Range": "bytes=0-8191"})
            assert got.content == payload
    finally:
        ceph_cluster.run("rbd", "rm", f"{ceph.POOL}/{prefix}rbd0")


async def test_a_missing_pool_is_a_422_and_leaves_nothing(
    rbd_client: httpx.AsyncClient, ceph_cluster: ceph.Cluster, prefix: str
) -> None:
    response = await make_rbd_device(rbd_client, "rbd0", pool="no-such-pool")
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    assert "pool 'no-such-pool' does not exist" in response.json()["detail"]
    assert (await rbd_client.get("/v1/devices/rbd0")).status_code == 404
    assert not [image for image in ceph_cluster.images() if image.startswith(prefix)]
    assert (await make_rbd_device(rbd_client, "rbd0")).status_code == 201


async def test_an_existing_image_of_the_same_name_is_a_409_and_is_kept(
    rbd_client: httpx.AsyncClient, ceph_cluster: ceph.Cluster, prefix: str
) -> None:
    ceph_cluster.run("rbd", "create", "--size", "1M", f"{ceph.POOL}/{prefix}rbd0")
    response = await make_rbd_device(rbd_client, "rbd0")
    assert response.status_code == 409
    assert "exists" in response.json()["detail"]
    assert f"{prefix}rbd0" in ceph_cluster.images()
    assert (await rbd_client.get("/v1/devices/rbd0")).status_code == 404


async def test_a_pool_without_store_rbd_is_a_422(rbd_client: httpx.AsyncClient) -> None:
    response = await rbd_client.post(
        "/v1/devices", json={"name": "f", "size_bytes": SIZE, "pool": "rbd"}
    )
    assert response.status_code == 422
    assert "pool applies only" in response.json()["detail"]
    assert (await rbd_client.get("/v1/devices/f")).status_code == 404


async def test_readyz_reports_the_cluster(rbd_client: httpx.AsyncClient) -> None:
    response = await rbd_client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["checks"]["ceph"] == "ok"


async def test_readyz_is_503_when_the_cluster_is_unreachable(
    data_dir: Path, tmp_path: Path
) -> None:
    conf = tmp_path / "nowhere.conf"
    conf.write_text(
        f"[global]\nmon host = v2:127.0.0.1:{ceph._free_port()}\nauth client required = none\n"
    )
    settings = Settings(
        data_dir=data_dir,
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
        ceph_conf=conf,
        ceph_timeout_seconds=1,
    )
    async with running(settings) as client:
        response = await client.get("/readyz")
        assert response.status_code == 503
        assert "unreachable" in response.json()["checks"]["ceph"]
        created = await make_rbd_device(client, "rbd0")
        assert created.status_code == 503
        assert (await client.get("/v1/devices/rbd0")).status_code == 404


async def test_store_rbd_without_a_ceph_conf_is_a_422(client: httpx.AsyncClient) -> None:
    response = await make_rbd_device(client, "rbd0")
    assert response.status_code == 422
    assert "REQCRYPT_CEPH_CONF" in response.json()["detail"]
    assert (await client.get("/v1/devices/rbd0")).status_code == 404


async def test_a_fenced_write_is_a_503_problem_and_reaches_no_byte_of_the_image(
    rbd_client: httpx.AsyncClient, ceph_cluster: ceph.Cluster, prefix: str
) -> None:
    """Another client takes the image over (as a node taking the volume would), which
    blocklists this service's client: the write is refused as ``Fenced``, never 204."""
    await make_rbd_device(rbd_client, "rbd0")
    await make_volume(rbd_client, "vol", xts_table("rbd0", SIZE // 512))
    put = await rbd_client.put(
        "/v1/volumes/vol/data", content=b"o" * 4096, headers={"Content-Range": "bytes 0-4095/*"}
    )
    assert put.status_code == 204  # this client now holds the image's exclusive lock
    assert (await rbd_client.post("/v1/volumes/vol/flush")).status_code == 204
    stored = ceph_cluster.export(f"{prefix}rbd0")
    other = CephCluster(ceph_cluster.conf)
    try:
        thief = RbdStore(other.ioctx(ceph.POOL), f"{prefix}rbd0", SIZE)
        thief.claim(take_over=True)
        thief.close()
    finally:
        other.close()
    refused = await rbd_client.put(
        "/v1/volumes/vol/data", content=b"x" * 4096, headers={"Content-Range": "bytes 0-4095/*"}
    )
    assert refused.status_code == 503
    assert refused.headers["content-type"] == "application/problem+json"
    assert "blocklisted" in refused.json()["detail"]
    assert (await rbd_client.post("/v1/volumes/vol/flush")).status_code == 503
    assert ceph_cluster.export(f"{prefix}rbd0") == stored
