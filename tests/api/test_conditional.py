"""Conditional I/O under concurrency: If-Match is checked with the write it guards, and an
ETag names the bytes it was served with."""

from __future__ import annotations

import asyncio
import os

import httpx
import pytest

from app.config import Settings
from tests.support.factories import make_device, make_volume

pytestmark = pytest.mark.anyio


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # A long plug window keeps every write in flight together: the race is wide open.
    return settings.model_copy(update={"plug_window_us": 100_000})


@pytest.fixture
async def volume(client: httpx.AsyncClient) -> None:
    await make_device(client)
    await make_volume(client)


async def test_of_concurrent_puts_holding_one_etag_exactly_one_succeeds(
    client: httpx.AsyncClient, volume: None
) -> None:
    tag = (await client.head("/v1/volumes/vol/data")).headers["etag"]
    bodies = [os.urandom(4096) for _ in range(12)]
    responses = await asyncio.gather(
        *(
            client.put(
                "/v1/volumes/vol/data",
                content=body,
                headers={"Content-Range": "bytes 0-4095/*", "If-Match": tag},
            )
            for body in bodies
        )
    )
    statuses = sorted(response.status_code for response in responses)
    assert statuses == [204] + [412] * 11
    (winner,) = [body for body, r in zip(bodies, responses, strict=True) if r.status_code == 204]
    read = await client.get("/v1/volumes/vol/data", headers={"Range": "bytes=0-4095"})
    assert read.content == winner


async def test_a_batch_holding_a_stale_etag_writes_nothing(
    client: httpx.AsyncClient, volume: None
) -> None:
    tag = (await client.head("/v1/volumes/vol/data")).headers["etag"]
    first = await client.put(
        "/v1/volumes/vol/data", content=b"1" * 512, headers={"Content-Range": "bytes 0-511/*"}
    )
    assert first.status_code == 204
    body = b"--b\r\nContent-Range: bytes 0-511/*\r\n\r\n" + b"2" * 512 + b"\r\n--b--\r\n"
    stale = await client.put(
        "/v1/volumes/vol/data",
        content=body,
        headers={"Content-Type": "multipart/byteranges; boundary=b", "If-Match": tag},
    )
    assert stale.status_code == 412
    read = await client.get("/v1/volumes/vol/data", headers={"Range": "bytes=0-511"})
    assert read.content == b"1" * 512


async def test_an_etag_never_names_two_contents(client: httpx.AsyncClient, volume: None) -> None:
    seen: dict[str, bytes] = {}

    async def writer(index: int) -> None:
        for round_ in range(15):
            await client.put(
                "/v1/volumes/vol/data",
                content=bytes([index * 16 + round_ % 16]) * 2048,
                headers={"Content-Range": f"bytes {index * 1024}-{index * 1024 + 2047}/*"},
            )

    async def reader() -> None:
        for _ in range(40):
            response = await client.get("/v1/volumes/vol/data", headers={"Range": "bytes=0-8191"})
            tag = response.headers.get("etag")
            if tag is not None:
                assert seen.setdefault(tag, response.content) == response.content, tag

    await asyncio.gather(*(writer(i) for i in range(4)), *(reader() for _ in range(4)))
    assert seen  # some reads did carry an ETag


async def test_a_write_answers_the_etag_of_the_version_it_made(
    client: httpx.AsyncClient, volume: None
) -> None:
    put = await client.put(
        "/v1/volumes/vol/data", content=b"v" * 512, headers={"Content-Range": "bytes 0-511/*"}
    )
    read = await client.get("/v1/volumes/vol/data", headers={"Range": "bytes=0-511"})
    assert put.headers["etag"] == read.headers["etag"]


async def test_a_streamed_read_carries_a_weak_etag(client: httpx.AsyncClient, volume: None) -> None:
    response = await client.get("/v1/volumes/vol/data")
    assert response.status_code == 200
    assert response.headers["etag"].startswith('W/"')
