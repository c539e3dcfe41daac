"""Trace replay over the API: an uploaded trace becomes a done benchmark run."""

from __future__ import annotations

import csv
import io

import anyio
import httpx
import pytest

from tests.support.factories import make_device, make_volume, xts_table

pytestmark = pytest.mark.anyio

IOLOG = (
    "fio version 3 iolog\n0 /dev/sdb add\n0 /dev/sdb open\n"
    + "".join(f"1 /dev/sdb write {i * 4096} 4096\n" for i in range(32))
    + "9 /dev/sdb read 1048576 65536\n10 /dev/sdb close\n"
)


async def test_replay_of_an_uploaded_iolog_is_a_done_run_with_csv(client: httpx.AsyncClient):
    body = {
        "label": "my workload",
        "replay": {
            "trace": IOLOG,
            "cipher": "aes-cbc-plain64",
            "engine": "omap-aes-am335x",
            "device_model": "sdcard-bbb",
        },
    }
    response = await client.post("/v1/benchmarks", json=body)
    assert response.status_code == 202, response.text
    run_id = response.json()["id"]
    run = (await client.get(f"/v1/benchmarks/{run_id}")).json()
    assert run["state"] == "done"
    modes = [(cell["engine"], cell["dispatch_mode"]) for cell in run["cells"]]
    assert ("omap-aes-am335x", "request") in modes
    assert ("omap-aes-am335x (no bulk)", "bio") in modes
    assert run["replay"]["gains"]["request_vs_bio"] > 0
    assert run["replay"]["trace"]["bios"] == 33
    rows = list(
        csv.DictReader(io.StringIO((await client.get(f"/v1/benchmarks/{run_id}/results.csv")).text))
    )
    assert len(rows) == 4


async def test_replay_refuses_a_workload_beside_it(client: httpx.AsyncClient):
    body = {"replay": {"trace": IOLOG}, "workload": {"rw": "write"}}
    response = await client.post("/v1/benchmarks", json=body)
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"


async def test_replay_with_unknown_engine_is_404(client: httpx.AsyncClient):
    response = await client.post(
        "/v1/benchmarks", json={"replay": {"trace": IOLOG, "engine": "nope"}}
    )
    assert response.status_code == 404


BOUNDARY = "replay-boundary"


def multipart(parts: list[tuple[int, bytes]]) -> bytes:
    body = b""
    for offset, data in parts:
        body += (
            (
                f"--{BOUNDARY}\r\nContent-Range: bytes {offset}-{offset + len(data) - 1}/*\r\n\r\n"
            ).encode()
            + data
            + b"\r\n"
        )
    return body + f"--{BOUNDARY}--\r\n".encode()


async def test_a_trace_the_service_recorded_replays_to_the_same_merges(
    client: httpx.AsyncClient,
):
    await make_device(client, size=1 << 20)
    await make_volume(client, table=xts_table(sectors=2048))
    batches = [
        [(i * 4096, b"a" * 4096) for i in range(24)],  # back merges
        [(i * 4096, b"b" * 4096) for i in reversed(range(40, 48))],  # front merges
        [(100 * 4096, b"c" * 4096), (102 * 4096, b"c" * 4096), (101 * 4096, b"c" * 4096)],
    ]
    text = ""

    async def trace() -> None:
        nonlocal text
        text = (await client.get("/v1/volumes/vol/trace", params={"seconds": 2})).text

    async with anyio.create_task_group() as group:
        group.start_soon(trace)
        await anyio.sleep(0.3)
        assert (await client.post("/v1/volumes/vol/stats/reset")).status_code == 204
        for parts in batches:
            response = await client.put(
                "/v1/volumes/vol/data",
                content=multipart(parts),
                headers={"Content-Type": f"multipart/byteranges; boundary={BOUNDARY}"},
            )
            assert response.status_code == 204, response.text
            await anyio.sleep(0.05)  # separate submissions, far past the plug window
        ranges = ",".join(f"{i * 4096}-{i * 4096 + 4095}" for i in range(200, 216))
        response = await client.get("/v1/volumes/vol/data", headers={"Range": f"bytes={ranges}"})
        assert response.status_code == 206
    stats = (await client.get("/v1/volumes/vol/status")).json()["stats"]
    response = await client.post("/v1/benchmarks", json={"replay": {"trace": text}})
    assert response.status_code == 202, response.text
    run = (await client.get(f"/v1/benchmarks/{response.json()['id']}")).json()
    replayed = next(cell for cell in run["cells"] if cell["dispatch_mode"] == "request")
    assert stats["front_merges"] > 0
    assert stats["request_merges"] > 0
    for counter in ("back_merges", "front_merges", "request_merges"):
        assert replayed[counter] == stats[counter], counter
    assert replayed["bios"] == 24 + 8 + 3 + 16
