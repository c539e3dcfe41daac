"""Batched I/O over HTTP: a multi-range GET and a multipart/byteranges PUT are one submission each."""

from __future__ import annotations

import os
import random

import httpx
import pytest

from app.config import Settings
from tests.support.factories import make_device, make_volume, xts_table

pytestmark = pytest.mark.anyio
SIZE = 1 << 20
BOUNDARY = "batch-boundary-7f3a"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"max_ranges": 64, "max_batch_bytes": 512 * 1024})


@pytest.fixture
async def volume(client: httpx.AsyncClient) -> None:
    await make_device(client, size=SIZE)
    await make_volume(client, table=xts_table(sectors=SIZE // 512))


def multipart(parts: list[tuple[int, bytes]], *, omit_range_of: int | None = None) -> bytes:
    body = b""
    for index, (offset, data) in enumerate(parts):
        body += f"--{BOUNDARY}\r\nContent-Type: application/octet-stream\r\n".encode()
        if index != omit_range_of:
            body += f"Content-Range: bytes {offset}-{offset + len(data) - 1}/*\r\n".encode()
        body += b"\r\n" + data + b"\r\n"
    return body + f"--{BOUNDARY}--\r\n".encode()


async def put_batch(
    client: httpx.AsyncClient, body: bytes, headers: dict[str, str] | None = None, query: str = ""
) -> httpx.Response:
    return await client.put(
        f"/v1/volumes/vol/data{query}",
        content=body,
        headers={"Content-Type": f"multipart/byteranges; boundary={BOUNDARY}", **(headers or {})},
    )


def split_multipart(response: httpx.Response) -> list[tuple[str, bytes]]:
    """(Content-Range, data) of each part, by the boundary the response names."""
    boundary = response.headers["content-type"].split("boundary=")[1].encode()
    chunks = response.content.split(b"\r\n--" + boundary)
    parts = []
    for chunk in chunks[1:-1]:
        head, _, data = chunk.partition(b"\r\n\r\n")
        headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n") if ": " in line)
        parts.append((headers["Content-Range"], data))
    assert chunks[-1] == b"--\r\n"
    return parts


async def read(client: httpx.AsyncClient, offset: int, length: int) -> bytes:
    response = await client.get(
        "/v1/volumes/vol/data", headers={"Range": f"bytes={offset}-{offset + length - 1}"}
    )
    assert response.status_code == 206
    return response.content


async def status(client: httpx.AsyncClient) -> dict[str, object]:
    response = await client.get("/v1/volumes/vol/status")
    stats: dict[str, object] = response.json()["stats"]
    return stats


def random_blocks(count: int, seed: int) -> list[tuple[int, bytes]]:
    rng = random.Random(seed)
    offsets = rng.sample(range(SIZE // 4096), count)
    return [(offset * 4096, os.urandom(4096)) for offset in offsets]


async def test_a_multipart_put_writes_every_part(client: httpx.AsyncClient, volume: None) -> None:
    parts = random_blocks(64, seed=1)
    response = await put_batch(client, multipart(parts))
    assert response.status_code == 204, response.text
    assert response.headers["etag"]
    for offset, data in parts:
        assert await read(client, offset, len(data)) == data


async def test_sequential_parts_merge_into_at_most_two_requests(
    client: httpx.AsyncClient, volume: None
) -> None:
    before = await status(client)
    parts = [(i * 4096, os.urandom(4096)) for i in range(64)]
    assert (await put_batch(client, multipart(parts))).status_code == 204
    after = await status(client)
    assert after["w_bios"] - before["w_bios"] == 64  # type: ignore[operator]
    assert after["w_ios"] - before["w_ios"] <= 2  # type: ignore[operator]


async def test_parts_in_any_order_overlapping_apply_in_body_order(
    client: httpx.AsyncClient, volume: None
) -> None:
    parts = [(8192, b"A" * 4096), (0, b"B" * 4096), (8192 + 10, b"C" * 5), (100, b"D" * 3)]
    assert (await put_batch(client, multipart(parts))).status_code == 204
    assert await read(client, 8192, 20) == b"A" * 10 + b"C" * 5 + b"A" * 5
    assert await read(client, 98, 7) == b"BBDDDBB"


@pytest.mark.parametrize(
    ("body", "status_code"),
    [
        (multipart([(0, b"x" * 4096), (4096, b"y" * 10)], omit_range_of=1), 400),
        (multipart([(0, b"x" * 4096), (SIZE - 1, b"yy")]), 416),
        (
            multipart([(0, b"x" * 4096)]).replace(b"bytes 0-4095", b"bytes 0-4000"),
            400,
        ),
        (multipart([(0, b"x" * 4096)])[:-30], 400),
    ],
    ids=["missing-content-range", "beyond-the-volume", "length-mismatch", "truncated"],
)
async def test_a_malformed_batch_writes_nothing(
    client: httpx.AsyncClient, volume: None, body: bytes, status_code: int
) -> None:
    before = await read(client, 0, 4096)
    response = await put_batch(client, body)
    assert response.status_code == status_code
    assert response.headers["content-type"] == "application/problem+json"
    assert await read(client, 0, 4096) == before


async def test_more_parts_than_max_ranges_are_refused(
    client: httpx.AsyncClient, volume: None
) -> None:
    response = await put_batch(client, multipart([(i * 512, b"p" * 512) for i in range(65)]))
    assert response.status_code == 413
    assert "at most 64 parts" in response.json()["detail"]


async def test_a_batch_body_over_max_batch_bytes_is_refused_unread(
    client: httpx.AsyncClient, volume: None
) -> None:
    response = await put_batch(client, multipart([(0, os.urandom(512 * 1024))]))
    assert response.status_code == 413


async def test_if_match_applies_to_the_batch_as_a_whole(
    client: httpx.AsyncClient, volume: None
) -> None:
    tag = (await client.head("/v1/volumes/vol/data")).headers["etag"]
    first = await put_batch(client, multipart([(0, b"1" * 512)]), {"If-Match": tag})
    assert first.status_code == 204
    stale = await put_batch(client, multipart([(0, b"2" * 512)]), {"If-Match": tag})
    assert stale.status_code == 412
    assert await read(client, 0, 512) == b"1" * 512


async def test_fua_batch_ends_with_one_flush(client: httpx.AsyncClient, volume: None) -> None:
    before = await status(client)
    body = multipart([(0, b"f" * 4096), (65536, b"g" * 4096)])
    assert (await put_batch(client, body, query="?fua=true")).status_code == 204
    after = await status(client)
    assert after["f_ios"] - before["f_ios"] == 1  # type: ignore[operator]


async def test_failed_parts_are_named_and_the_others_written(client: httpx.AsyncClient) -> None:
    await make_device(client, size=SIZE)
    half = SIZE // 512 // 2
    await make_volume(client, table=f"{xts_table(sectors=half)}\n{half} {half} error")
    parts = [(0, b"k" * 4096), (half * 512, b"e" * 4096)]
    response = await put_batch(client, multipart(parts))
    assert response.status_code >= 400
    problem = response.json()
    assert [failure["range"] for failure in problem["failed"]] == [
        f"bytes {half * 512}-{half * 512 + 4095}"
    ]
    assert await read(client, 0, 4096) == b"k" * 4096


async def test_a_multi_range_get_reads_every_range(client: httpx.AsyncClient, volume: None) -> None:
    parts = random_blocks(64, seed=2)
    assert (await put_batch(client, multipart(parts))).status_code == 204
    ranges = ",".join(f"{o}-{o + 4095}" for o, _ in parts)
    response = await client.get("/v1/volumes/vol/data", headers={"Range": f"bytes={ranges}"})
    assert response.status_code == 206
    assert split_multipart(response) == [
        (f"bytes {o}-{o + 4095}/{SIZE}", data) for o, data in parts
    ]


async def test_a_multi_range_get_is_one_submission(client: httpx.AsyncClient, volume: None) -> None:
    before = await status(client)
    ranges = ",".join(f"{i * 4096}-{i * 4096 + 4095}" for i in range(32))
    response = await client.get("/v1/volumes/vol/data", headers={"Range": f"bytes={ranges}"})
    assert response.status_code == 206
    after = await status(client)
    assert after["r_bios"] - before["r_bios"] == 32  # type: ignore[operator]
    assert after["r_ios"] - before["r_ios"] == 1  # type: ignore[operator]


async def test_more_ranges_than_max_ranges_are_refused(
    client: httpx.AsyncClient, volume: None
) -> None:
    ranges = ",".join(f"{i * 512}-{i * 512 + 1}" for i in range(65))
    response = await client.get("/v1/volumes/vol/data", headers={"Range": f"bytes={ranges}"})
    assert response.status_code == 400
    assert "at most 64 ranges" in response.json()["detail"]


async def test_ranges_over_max_batch_bytes_are_refused(
    client: httpx.AsyncClient, volume: None
) -> None:
    response = await client.get(
        "/v1/volumes/vol/data", headers={"Range": "bytes=0-300000,400000-700000"}
    )
    assert response.status_code == 413
