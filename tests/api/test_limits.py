"""Resource limits (REQCRYPT_MAX_*, body deadlines): each refused with a problem, nothing written."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI

from app.config import Settings
from tests.support.factories import make_device, make_volume, xts_table
from tests.support.keys import XTS_KEY

pytestmark = pytest.mark.anyio

MiB = 1 << 20


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "max_device_bytes": 8 * MiB,
            "max_total_device_bytes": 12 * MiB,
            "max_devices": 3,
            "max_volumes": 2,
            "max_table_lines": 4,
            "max_table_line_length": 256,
            "max_volume_ios": 1,
            "body_timeout_seconds": 0.3,
            "body_min_rate_bytes": 4096,
            "max_benchmark_jobs": 1,
            "max_benchmark_bytes": 4 * MiB,
        }
    )


def assert_problem(response: httpx.Response, status: int, *words: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    for word in words:
        assert word in body["detail"]
    assert XTS_KEY not in response.text
    return body


def device_files(settings: Settings) -> list[str]:
    return sorted(path.stem for path in Path(settings.devices_dir).glob("*.img"))


async def device_names(client: httpx.AsyncClient) -> list[str]:
    return [d["name"] for d in (await client.get("/v1/devices")).json()]


async def test_a_device_larger_than_max_device_bytes_is_a_422_and_creates_nothing(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    response = await client.post("/v1/devices", json={"name": "big", "size_bytes": 8 * MiB + 512})
    assert_problem(response, 422, "REQCRYPT_MAX_DEVICE_BYTES")
    assert await device_names(client) == []
    assert "big" not in device_files(settings)
    await make_device(client, "big", 8 * MiB)


async def test_devices_beyond_the_total_size_are_a_507_and_create_nothing(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    await make_device(client, "a", 8 * MiB)
    response = await client.post("/v1/devices", json={"name": "b", "size_bytes": 4 * MiB + 512})
    assert_problem(response, 507, "REQCRYPT_MAX_TOTAL_DEVICE_BYTES")
    assert await device_names(client) == ["a"]
    assert device_files(settings) == ["a"]
    await make_device(client, "b", 4 * MiB)


async def test_devices_beyond_max_devices_are_a_409_until_one_is_deleted(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    for name in ("a", "b", "c"):
        await make_device(client, name, MiB)
    response = await client.post("/v1/devices", json={"name": "d", "size_bytes": MiB})
    assert_problem(response, 409, "REQCRYPT_MAX_DEVICES")
    assert device_files(settings) == ["a", "b", "c"]
    assert (await client.delete("/v1/devices/a")).status_code == 204
    await make_device(client, "d", MiB)


async def test_volumes_beyond_max_volumes_are_a_409(client: httpx.AsyncClient) -> None:
    await make_device(client, "sda2", MiB)
    await make_volume(client, "v1", table="0 64 linear sda2 0")
    await make_volume(client, "v2", table="0 64 linear sda2 64")
    response = await client.post(
        "/v1/volumes", json={"name": "v3", "table": "0 64 linear sda2 128"}
    )
    assert_problem(response, 409, "REQCRYPT_MAX_VOLUMES")
    assert [v["name"] for v in (await client.get("/v1/volumes")).json()] == ["v1", "v2"]


async def test_a_table_with_more_lines_than_max_table_lines_is_refused_at_its_first_extra_line(
    client: httpx.AsyncClient,
) -> None:
    await make_device(client, "sda2", MiB)
    table = "\n".join(f"{i * 8} 8 linear sda2 {i * 8}" for i in range(5))
    response = await client.post("/v1/volumes", json={"name": "v", "table": table})
    body = assert_problem(response, 422, "REQCRYPT_MAX_TABLE_LINES")
    assert (body["line"], body["field"]) == (5, "table")
    assert (await client.get("/v1/volumes")).json() == []


async def test_a_table_line_longer_than_the_limit_is_refused_without_echoing_its_key(
    client: httpx.AsyncClient,
) -> None:
    await make_device(client, "sda2", MiB)
    await make_volume(client, "v", table=xts_table(sectors=64))
    long_line = xts_table(sectors=64) + " " * 100 + " 1 sector_size:512"
    response = await client.put("/v1/volumes/v/table", json={"table": long_line})
    body = assert_problem(response, 422, "REQCRYPT_MAX_TABLE_LINE_LENGTH")
    assert (body["line"], body["field"]) == (1, "line")
    assert (await client.get("/v1/volumes/v")).json()["tables"] == ["LIVE"]


async def suspended_write(client: httpx.AsyncClient, volume: str) -> httpx.Response:
    return await client.put(
        f"/v1/volumes/{volume}/data",
        content=b"x" * 512,
        headers={"Content-Range": "bytes 0-511/*"},
    )


async def wait_until(predicate: Any) -> None:
    with anyio.fail_after(5):
        while not predicate():
            await anyio.sleep(0.01)


async def test_io_beyond_max_volume_ios_is_a_503_with_retry_after_and_other_volumes_go_on(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    await make_device(client, "sda2", MiB)
    await make_volume(client, "held", table="0 64 linear sda2 0")
    await make_volume(client, "free", table="0 64 linear sda2 64")
    await client.post("/v1/volumes/held/suspend")
    state = app.state.reqcrypt
    held = state.control.volume("held")
    blocked = asyncio.create_task(suspended_write(client, "held"))
    await wait_until(lambda: state.admission.in_flight(held) == 1)
    refused = await client.get("/v1/volumes/held/data", headers={"Range": "bytes=0-511"})
    body = assert_problem(refused, 503, "REQCRYPT_MAX_VOLUME_IOS")
    assert refused.headers["retry-after"] == "1"
    assert body["status"] == 503
    other = await client.put(
        "/v1/volumes/free/data", content=b"y" * 512, headers={"Content-Range": "bytes 0-511/*"}
    )
    assert other.status_code == 204
    await client.post("/v1/volumes/held/resume")
    assert (await blocked).status_code == 204
    assert state.admission.in_flight(held) == 0
    back = await client.get("/v1/volumes/held/data", headers={"Range": "bytes=0-511"})
    assert back.content == b"x" * 512


async def trickle(data: bytes, piece: int, pause: float) -> AsyncIterator[bytes]:
    for at in range(0, len(data), piece):
        await anyio.sleep(pause)
        yield data[at : at + piece]


@pytest.mark.parametrize(
    ("piece", "pause"),
    [(4096, 0.6), (256, 0.1)],
    ids=["a-pause-longer-than-body-timeout", "steady-but-slower-than-min-rate"],
)
async def test_a_body_arriving_too_slowly_is_a_408_and_writes_nothing(
    app: FastAPI, client: httpx.AsyncClient, piece: int, pause: float
) -> None:
    await make_device(client, "sda2", MiB)
    await make_volume(client, "v", table=xts_table(sectors=64))
    before = (await client.get("/v1/volumes/v/data", headers={"Range": "bytes=0-8191"})).content
    data = os.urandom(8192)
    response = await client.put(
        "/v1/volumes/v/data",
        content=trickle(data, piece, pause),
        headers={"Content-Range": "bytes 0-8191/*", "Content-Length": "8192"},
    )
    assert_problem(response, 408, "REQCRYPT_BODY_TIMEOUT_SECONDS")
    assert response.headers["connection"] == "close"
    after = (await client.get("/v1/volumes/v/data", headers={"Range": "bytes=0-8191"})).content
    assert after == before
    volume = app.state.reqcrypt.control.volume("v")
    assert app.state.reqcrypt.admission.in_flight(volume) == 0


async def test_a_body_trickled_within_its_deadline_is_written(client: httpx.AsyncClient) -> None:
    await make_device(client, "sda2", MiB)
    await make_volume(client, "v", table=xts_table(sectors=64))
    data = os.urandom(4096)
    response = await client.put(
        "/v1/volumes/v/data",
        content=trickle(data, 1024, 0.05),
        headers={"Content-Range": "bytes 0-4095/*", "Content-Length": "4096"},
    )
    assert response.status_code == 204
    back = await client.get("/v1/volumes/v/data", headers={"Range": "bytes=0-4095"})
    assert back.content == data


TEMPLATE = {"table": f"0 8192 crypt aes-xts-plain64 {XTS_KEY} 0 {{dev}} 0", "device_size": "4M"}


async def test_a_benchmark_moving_more_than_max_benchmark_bytes_is_a_422_and_not_recorded(
    client: httpx.AsyncClient,
) -> None:
    job = {
        "volume_template": TEMPLATE,
        "workload": {"rw": "write", "bs": "64k", "size": "3M"},
        "sweep": {"dispatch_mode": ["bio", "request"]},
    }
    response = await client.post("/v1/benchmarks", json=job)
    assert_problem(response, 422, "REQCRYPT_MAX_BENCHMARK_BYTES")
    assert (await client.get("/v1/benchmarks")).json() == []


async def test_a_scenario_beyond_a_benchmark_limit_queues_none_of_its_jobs(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post("/v1/benchmarks", json={"scenario": "dd-512k"})
    assert_problem(response, 422, "REQCRYPT_MAX_BENCHMARK_BYTES")
    assert (await client.get("/v1/benchmarks")).json() == []


async def test_benchmark_jobs_beyond_max_benchmark_jobs_are_a_503_with_retry_after(
    client: httpx.AsyncClient,
) -> None:
    job = {
        "volume_template": TEMPLATE,
        "workload": {"rw": "write", "bs": "4k", "size": "1M", "runtime": 1.0},
        "rounds": 1,
        "warmup": 0,
    }
    first = await client.post("/v1/benchmarks", json=job)
    assert first.status_code == 202
    second = await client.post("/v1/benchmarks", json=job)
    assert_problem(second, 503, "REQCRYPT_MAX_BENCHMARK_JOBS")
    assert "retry-after" in second.headers
    assert len((await client.get("/v1/benchmarks")).json()) == 1
    with anyio.fail_after(20):
        while (await client.get(f"/v1/benchmarks/{first.json()['id']}")).json()["state"] != "done":
            await anyio.sleep(0.1)
    assert (await client.post("/v1/benchmarks", json=job)).status_code == 202
