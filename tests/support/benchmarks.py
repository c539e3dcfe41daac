"""Benchmark jobs over the API, run to the end."""

from __future__ import annotations

from typing import Any

import anyio
import httpx


async def run_job(client: httpx.AsyncClient, job: dict[str, Any]) -> dict[str, Any]:
    response = await client.post("/v1/benchmarks", json=job)
    assert response.status_code == 202, response.text
    run_id = response.json()["id"]
    assert response.headers["location"] == f"/v1/benchmarks/{run_id}"
    with anyio.fail_after(20):
        while True:
            body: dict[str, Any] = (await client.get(f"/v1/benchmarks/{run_id}")).json()
            assert body["state"] in ("queued", "running", "done"), body
            assert 0.0 <= body["progress"] <= 1.0
            if body["state"] == "done":
                return body
            await anyio.sleep(0.05)
