"""The live block trace over the API."""

from __future__ import annotations

import anyio
import httpx
import pytest

from app.blk.trace import parse_blkparse, summarize
from tests.support.factories import make_device, make_volume

pytestmark = pytest.mark.anyio


async def test_trace_streams_blkparse_events_of_the_volumes_io(client: httpx.AsyncClient):
    await make_device(client)
    await make_volume(client)
    text = ""

    async def trace() -> None:
        nonlocal text
        response = await client.get("/v1/volumes/vol/trace", params={"seconds": 1})
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/plain")
        text = response.text

    async with anyio.create_task_group() as group:
        group.start_soon(trace)
        await anyio.sleep(0.3)
        response = await client.put(
            "/v1/volumes/vol/data",
            content=b"x" * 8192,
            headers={"Content-Range": "bytes 0-8191/*"},
        )
        assert response.status_code == 204
    parsed = parse_blkparse(text.splitlines())
    assert parsed.bad.count == 0
    assert {"Q", "G", "I", "D", "C"} <= {record.action for record in parsed.records}
    assert any(
        record.action == "m" and record.rest.startswith("crypt encrypt 0 + 16 calls=")
        for record in parsed.records
    )
    assert summarize(parsed.records).phases["Q2C"]
    assert text.splitlines()[-1] == "Skips: 0 forward (0 -   0.0%)"


async def test_trace_is_for_admins_only(io_client: httpx.AsyncClient, client: httpx.AsyncClient):
    await make_device(client)
    await make_volume(client)
    response = await io_client.get("/v1/volumes/vol/trace", params={"seconds": 1})
    assert response.status_code == 403


@pytest.mark.parametrize("seconds", [0, 301, 1.5])
async def test_trace_duration_is_bounded(client: httpx.AsyncClient, seconds: float):
    await make_device(client)
    await make_volume(client)
    response = await client.get("/v1/volumes/vol/trace", params={"seconds": seconds})
    assert response.status_code == 422


async def test_trace_of_unknown_volume_is_404(client: httpx.AsyncClient):
    response = await client.get("/v1/volumes/nope/trace", params={"seconds": 1})
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"
