"""Built-in scenarios over the API: a modelled one is a done run, a job-backed one queues its jobs."""

from __future__ import annotations

import httpx
import pytest

from app.bench.scenarios import SCENARIOS
from app.config import Settings

pytestmark = pytest.mark.anyio


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Room for one job at a time: a one-job scenario fits, a two-job one does not."""
    return settings.model_copy(update={"max_benchmark_jobs": 1})


async def test_the_dm_crypt_flags_scenario_is_recorded_done_with_its_predictions(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post("/v1/benchmarks", json={"scenario": "dm-crypt-flags"})
    assert response.status_code == 202, response.text
    started = response.json()
    assert started["state"] == "done"
    assert started["runs"] == [started["id"]]
    run = (await client.get(f"/v1/benchmarks/{started['id']}")).json()
    assert run["state"] == "done"
    assert run["spec"]["scenario"] == "dm-crypt-flags"
    predicted = {
        (row["source"], row["configuration"], row["role"]) for row in run["scenario"]["predictions"]
    }
    assert ("blog", "same_cpu_crypt", "held out") in predicted
    assert ("rfc", "stock", "fitted") in predicted
    assert "| submit_from_crypt_cpus |" in run["scenario"]["markdown"]
    assert run["scenario"]["split_sweep"]


async def test_a_scenario_made_of_jobs_queues_one_run_per_job(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/benchmarks", json={"scenario": "sector-size"})
    assert response.status_code == 202, response.text
    started = response.json()
    assert len(started["runs"]) == len(SCENARIOS["sector-size"].jobs())
    assert started["id"] == started["runs"][0]
    listed = {run["id"] for run in (await client.get("/v1/benchmarks")).json()}
    assert set(started["runs"]) <= listed


async def test_an_unknown_scenario_is_a_422_naming_the_built_in_ones(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post("/v1/benchmarks", json={"scenario": "nope"})
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    assert "dm-crypt-flags" in response.json()["detail"]


async def test_a_scenario_of_more_jobs_than_are_free_queues_none_of_them(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post("/v1/benchmarks", json={"scenario": "dd-512k"})
    assert response.status_code == 503, response.text
    assert "REQCRYPT_MAX_BENCHMARK_JOBS" in response.json()["detail"]
    assert (await client.get("/v1/benchmarks")).json() == []
