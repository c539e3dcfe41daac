"""Benchmark jobs over the API: start, poll, cells, exports, errors, auth."""

from __future__ import annotations

import csv
import dataclasses
import io
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI

from app.bench import report
from app.bench.spec import ROUNDS
from app.engine.cost import ModelledWorkload, predict_workload
from app.engine.kcryptd import QueueFlags, io_time
from app.engine.model import DeviceModel, EngineProfile
from app.engine.queuefit import QUEUE_CALIBRATIONS
from app.errors import InvalidInput
from tests.support.benchmarks import run_job
from tests.support.keys import CBC_KEY, XTS_KEY

pytestmark = pytest.mark.anyio

TEMPLATE = {
    "table": f"0 8192 crypt aes-cbc-plain64 {CBC_KEY} 0 {{dev}} 0",
    "device_size": 4 << 20,
    "device_model": "sdcard-bbb",
}
JOB: dict[str, Any] = {
    "volume_template": TEMPLATE,
    "engine": "omap-aes-am335x",
    "workload": {"rw": "write", "bs": "4k", "size": "1M", "iodepth": 8, "numjobs": 1},
    "sweep": {"dispatch_mode": ["bio", "request"]},
}
CELL_FIELDS = {
    "dispatch_mode",
    "engine",
    "bs",
    "rw",
    "measured_mb_s",
    "modelled_mb_s",
    "iops",
    "p50_ms",
    "p99_ms",
    "cpu_s",
    "bios",
    "requests",
    "merges",
    "engine_calls",
}


@pytest.fixture
async def finished(client: httpx.AsyncClient) -> dict[str, Any]:
    return await run_job(client, JOB)


async def test_a_template_job_reports_one_cell_per_sweep_point(
    finished: dict[str, Any],
) -> None:
    assert finished["progress"] == 1.0
    # two cells, each one warm-up round and ROUNDS.default kept rounds of 1 MiB
    assert finished["bytes_done"] == 2 * (1 << 20) * (ROUNDS.default + 1)
    cells = finished["cells"]
    assert [cell["dispatch_mode"] for cell in cells] == ["bio", "request"]
    for cell in cells:
        assert set(cell) >= CELL_FIELDS
        assert cell["engine"] == "omap-aes-am335x"
        assert cell["rw"] == "write"
        assert cell["bs"] == 4096
        assert cell["bios"] == 256
        assert cell["modelled_mb_s"] > 0
    assert finished["figures"]["measured_mb_s"] == "measured"
    assert finished["figures"]["modelled_mb_s"] == "modelled"


async def test_request_mode_makes_fewer_engine_calls_for_queued_sequential_writes(
    finished: dict[str, Any],
) -> None:
    bio, request = finished["cells"]
    assert bio["engine_calls"] == bio["bios"]
    assert request["merges"] > 0
    assert request["engine_calls"] < bio["engine_calls"]


async def test_storage_time_is_the_device_timers_one_io_per_request(
    finished: dict[str, Any],
) -> None:
    for cell in finished["cells"]:
        assert cell["device_ios"] == cell["requests"]
        assert cell["storage_ms"] > 0
        assert cell["modelled_ms"] >= cell["storage_ms"] / cell["requests"]
    assert finished["figures"]["storage_ms"] == "modelled"


async def test_a_cells_modelled_time_is_the_predictors_for_the_same_workload(
    client: httpx.AsyncClient,
) -> None:
    """Queue depth 2 keeps at most 2 one-call I/Os in flight: 2 of the 4 channels overlap."""
    caps = {"ciphers": ["aes"], "chainmodes": ["cbc"], "bulk_ivmodes": ["plain64"], "channels": 4}
    cost = {"setup_ns": 1e6, "encrypt_bytes_per_s": 1e12, "decrypt_bytes_per_s": 1e12}
    engine = await client.post(
        "/v1/engines", json={"name": "four-lanes", "capabilities": caps, "cost": cost}
    )
    assert engine.status_code == 201, engine.text
    job = {
        "volume_template": {**TEMPLATE, "device_model": "none"},
        "engine": "four-lanes",
        "workload": {"rw": "read", "bs": "4k", "size": "40k", "iodepth": 2, "numjobs": 1},
        "sweep": {"dispatch_mode": ["bio"]},
    }
    (cell,) = (await run_job(client, job))["cells"]
    assert (cell["requests"], cell["engine_calls"]) == (10, 10)
    shown = {key: value for key, value in engine.json().items() if key != "stats"}
    profile = EngineProfile.from_dict(shown)
    workload = ModelledWorkload(
        op="read", io_bytes=4096, count=10, queue_depth=2, dispatch_mode="bio"
    )
    predicted = predict_workload(profile, DeviceModel(name="none"), workload)
    assert cell["modelled_ms"] == pytest.approx(predicted.total_ns / 1e6, abs=1e-3)


@pytest.mark.parametrize(
    "flag",
    ["", "same_cpu_crypt", "submit_from_crypt_cpus", "no_read_workqueue", "no_write_workqueue"],
)
async def test_a_volumes_queue_flags_give_the_queue_models_time_through_the_data_path(
    client: httpx.AsyncClient, flag: str
) -> None:
    """The blog's platform as presets: each 4 KiB I/O at queue depth 1 takes what the
    queue model says that flag's path takes (device, cipher, hops), read and write."""
    features = f" 1 {flag}" if flag else ""
    job = {
        "volume_template": {
            "table": f"0 8192 crypt aes-xts-plain64 {XTS_KEY} 0 {{dev}} 0{features}",
            "device_size": 4 << 20,
            "device_model": "brd-g9",
        },
        "engine": "aesni-g9",
        "workload": {"bs": "4k", "size": "400k", "iodepth": 1},
        "sweep": {"rw": ["read", "write"], "dispatch_mode": ["bio"]},
        "rounds": 1,
        "warmup": 0,
    }
    platform = QUEUE_CALIBRATIONS["blog"].platform
    flags = QueueFlags(**{flag: True} if flag else {})
    for cell in (await run_job(client, job))["cells"]:
        predicted = io_time(
            dataclasses.replace(platform, hop_ns=3769.0), flags, cell["rw"]
        ).total_ns
        assert cell["requests"] == 100
        assert cell["modelled_ms"] == pytest.approx(100 * predicted / 1e6, abs=1e-3), cell["rw"]


async def test_request_mode_pays_dm_crypts_queue_hops_once_per_merged_request(
    client: httpx.AsyncClient,
) -> None:
    job = {
        "volume_template": {
            "table": f"0 8192 crypt aes-xts-plain64 {XTS_KEY} 0 {{dev}} 0",
            "device_size": 4 << 20,
            "device_model": "brd-g9",
        },
        "engine": "aesni-g9",
        "workload": {"rw": "write", "bs": "4k", "size": "1M", "iodepth": 8},
        "sweep": {"dispatch_mode": ["bio", "request"]},
        "rounds": 1,
        "warmup": 0,
    }
    cells = {cell["dispatch_mode"]: cell for cell in (await run_job(client, job))["cells"]}
    hops = 3  # kcryptd, dmcrypt_write, the submitter's wake
    for cell in cells.values():
        assert cell["queue_ms"] == pytest.approx(cell["requests"] * hops * 3769.0 / 1e6, abs=1e-3)
    assert cells["request"]["requests"] < cells["bio"]["requests"]


async def test_the_run_records_machine_and_a_redacted_spec(finished: dict[str, Any]) -> None:
    assert finished["machine"]["cpu_count"] >= 1
    assert {"python", "numpy", "cryptography", "openssl"} <= set(finished["machine"])
    assert CBC_KEY not in str(finished["spec"])
    assert finished["spec"]["workload"]["bs"] == 4096


async def test_template_devices_and_volumes_are_removed(
    client: httpx.AsyncClient, finished: dict[str, Any]
) -> None:
    assert (await client.get("/v1/volumes")).json() == []
    assert (await client.get("/v1/devices")).json() == []


async def test_plot_is_a_png(client: httpx.AsyncClient, finished: dict[str, Any]) -> None:
    response = await client.get(f"/v1/benchmarks/{finished['id']}/plot.png")
    assert response.status_code == 200
    assert response.headers["content-type"] == "image/png"
    assert response.content.startswith(b"\x89PNG\r\n\x1a\n")


async def test_csv_export_has_a_row_per_cell(
    client: httpx.AsyncClient, finished: dict[str, Any]
) -> None:
    response = await client.get(f"/v1/benchmarks/{finished['id']}/results.csv")
    assert response.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert [row["dispatch_mode"] for row in rows] == ["bio", "request"]
    assert rows[0]["engine_calls"] == str(finished["cells"][0]["engine_calls"])


async def test_json_export_and_list(client: httpx.AsyncClient, finished: dict[str, Any]) -> None:
    exported = (await client.get(f"/v1/benchmarks/{finished['id']}/results.json")).json()
    assert exported["cells"] == finished["cells"]
    listed = (await client.get("/v1/benchmarks")).json()
    assert [run["id"] for run in listed] == [finished["id"]]
    assert listed[0]["state"] == "done"


async def test_a_named_volume_is_retuned_per_cell_and_restored(
    client: httpx.AsyncClient,
) -> None:
    await client.post("/v1/devices", json={"name": "sdb", "size_bytes": 1 << 20})
    table = f"0 2048 crypt aes-cbc-plain64 {CBC_KEY} 0 sdb 0"
    await client.post("/v1/volumes", json={"name": "v", "table": table, "dispatch_mode": "bio"})
    job = {
        "volume": "v",
        "engine": "omap-aes-am335x",
        "workload": {"rw": "randread", "bs": "8k", "size": "256k", "seed": 3},
        "sweep": {"dispatch_mode": ["request"]},
    }
    done = await run_job(client, job)
    assert done["cells"][0]["dispatch_mode"] == "request"
    volume = (await client.get("/v1/volumes/v")).json()
    assert (volume["dispatch_mode"], volume["engine"]) == ("bio", "software")


async def test_unknown_benchmark_is_a_404_problem(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/benchmarks/nope")
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["detail"] == "benchmark nope not found"
    assert (await client.get("/v1/benchmarks/nope/plot.png")).status_code == 404


async def test_unknown_volume_is_refused_at_submission(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/benchmarks", json={"volume": "ghost"})
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"


async def test_a_workload_larger_than_the_device_is_a_422(client: httpx.AsyncClient) -> None:
    job = {**JOB, "workload": {"rw": "write", "bs": "4k", "size": "8M"}}
    response = await client.post("/v1/benchmarks", json=job)
    assert response.status_code == 422
    assert "device_size" in response.json()["detail"]


async def test_the_io_token_cannot_start_a_job(io_client: httpx.AsyncClient) -> None:
    response = await io_client.post("/v1/benchmarks", json=JOB)
    assert response.status_code == 403


async def test_an_engine_that_cannot_run_the_cipher_is_a_422_at_submission(
    client: httpx.AsyncClient,
) -> None:
    xts = {**TEMPLATE, "table": f"0 8192 crypt aes-xts-plain64 {CBC_KEY}{CBC_KEY} 0 {{dev}} 0"}
    response = await client.post("/v1/benchmarks", json={**JOB, "volume_template": xts})
    assert response.status_code == 422
    assert response.json()["detail"] == (
        "engine omap-aes-am335x cannot run cell 0: chain mode xts is not supported "
        "(has cbc, ctr, ecb)"
    )
    assert (await client.get("/v1/benchmarks")).json() == []


async def test_each_cell_is_the_median_of_its_rounds_with_an_interval(
    client: httpx.AsyncClient,
) -> None:
    done = await run_job(client, {**JOB, "rounds": 3, "warmup": 0})
    for cell in done["cells"]:
        assert len(cell["measured_mb_s_rounds"]) == cell["rounds"] == 3
        assert cell["measured_mb_s"] == sorted(cell["measured_mb_s_rounds"])[1]
        assert cell["measured_mb_s_low"] <= cell["measured_mb_s"] <= cell["measured_mb_s_high"]
        assert any("covers only 75 %" in warning for warning in cell["warnings"])


async def test_csv_export_carries_the_intervals(
    client: httpx.AsyncClient, finished: dict[str, Any]
) -> None:
    response = await client.get(f"/v1/benchmarks/{finished['id']}/results.csv")
    row = next(csv.DictReader(io.StringIO(response.text)))
    cell = finished["cells"][0]
    assert (row["rounds"], row["modelled_mb_s_low"], row["modelled_mb_s_high"]) == (
        "6",
        str(cell["modelled_mb_s_low"]),
        str(cell["modelled_mb_s_high"]),
    )


async def test_a_named_volume_whose_cipher_the_engine_cannot_run_is_a_422(
    client: httpx.AsyncClient,
) -> None:
    await client.post("/v1/devices", json={"name": "sdx", "size_bytes": 1 << 20})
    table = f"0 2048 crypt aes-xts-plain64 {CBC_KEY}{CBC_KEY} 0 sdx 0"
    await client.post("/v1/volumes", json={"name": "xv", "table": table})
    job = {"volume": "xv", "engine": "mv-cesa", "workload": {"bs": "4k", "size": "64k"}}
    response = await client.post("/v1/benchmarks", json=job)
    assert response.status_code == 422
    assert response.json()["detail"].startswith("engine mv-cesa cannot run cell 0: chain mode xts")


async def test_rounds_are_interleaved_across_cells(
    app: FastAPI, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round r of every cell runs before round r + 1 of any: load drift hits both sides."""
    runner = app.state.reqcrypt.benchmarks.cells
    order: list[str] = []
    measure = runner._measure

    def recorded(volume: Any, plan: Any, *args: Any) -> Any:
        order.append(str(plan.dispatch_mode))
        return measure(volume, plan, *args)

    monkeypatch.setattr(runner, "_measure", recorded)
    await run_job(client, {**JOB, "rounds": 2, "warmup": 1})
    assert order == ["bio", "request"] * 3


async def test_a_failed_runs_plot_is_drawn_as_failed_with_the_error(
    app: FastAPI, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = app.state.reqcrypt.benchmarks.cells

    def broken(*_: Any) -> Any:
        raise InvalidInput("the device went away")

    monkeypatch.setattr(runner, "_measure", broken)
    run_id = (await client.post("/v1/benchmarks", json=JOB)).json()["id"]
    with anyio.fail_after(20):
        while (await client.get(f"/v1/benchmarks/{run_id}")).json()["state"] != "failed":
            await anyio.sleep(0.05)
    drawn: dict[str, Any] = {}
    plot_png = report.plot_png

    def spy(cells: Any, **options: Any) -> bytes:
        drawn.update(options)
        return plot_png(cells, **options)

    monkeypatch.setattr(report, "plot_png", spy)
    response = await client.get(f"/v1/benchmarks/{run_id}/plot.png")
    assert response.status_code == 200
    assert drawn["failure"] == "the device went away"
