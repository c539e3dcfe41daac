"""Trace replay over the API: an uploaded trace becomes a done benchmark run."""

from __future__ import annotations

import csv
import io

import httpx
import pytest

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
    assert "replay takes no" in response.json()["detail"]


async def test_replay_with_unknown_engine_is_404(client: httpx.AsyncClient):
    response = await client.post(
        "/v1/benchmarks", json={"replay": {"trace": IOLOG, "engine": "nope"}}
    )
    assert response.status_code == 404
