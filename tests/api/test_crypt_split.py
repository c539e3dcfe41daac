"""dm-crypt's split (max_read_size / max_write_size): the service default, a volume's own,
and what it does to a large I/O on an engine with several channels."""

from __future__ import annotations

import httpx
import pytest

from app.config import Settings
from app.engine.cost import ModelledWorkload, predict_workload
from app.engine.model import DeviceModel, EngineProfile, ModelSpec
from tests.support.benchmarks import run_job
from tests.support.factories import make_device, make_volume, xts_table

pytestmark = pytest.mark.anyio

KIB = 1024


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"crypt_max_write_size": 256 * KIB})


async def test_a_volume_takes_the_services_split_where_it_sets_none(
    client: httpx.AsyncClient,
) -> None:
    await make_device(client)
    body = await make_volume(client, crypt_split={"max_read_size": 64 * KIB})
    assert body["crypt_split"] == {"max_read_size": 64 * KIB, "max_write_size": 256 * KIB}


async def four_cpus(client: httpx.AsyncClient) -> EngineProfile:
    """A CPU-like bulk engine: one call per piece, four pieces at once."""
    caps = {
        "ciphers": ["aes"],
        "chainmodes": ["xts"],
        "bulk_ivmodes": ["plain64"],
        "channels": 4,
        "max_bytes_per_call": 1 << 20,
    }
    cost = {"setup_ns": 2000.0, "encrypt_bytes_per_s": 1e9, "decrypt_bytes_per_s": 1e9}
    response = await client.post(
        "/v1/engines", json={"name": "four-cpus", "capabilities": caps, "cost": cost}
    )
    assert response.status_code == 201, response.text
    shown = {key: value for key, value in response.json().items() if key != "stats"}
    return EngineProfile.from_dict(shown)


async def test_split_reads_spread_over_the_engines_channels_as_the_model_predicts(
    client: httpx.AsyncClient,
) -> None:
    profile = await four_cpus(client)
    await make_device(client, size=8 << 20)
    await make_volume(client, table=xts_table(sectors=16384), engine="four-cpus")
    job = {
        "volume": "vol",
        "workload": {"rw": "read", "bs": "1M", "size": "4M", "iodepth": 1},
        "sweep": {"dispatch_mode": ["bio"]},
        "rounds": 1,
        "warmup": 0,
    }
    (whole,) = (await run_job(client, job))["cells"]
    response = await client.patch(
        "/v1/volumes/vol", json={"crypt_split": {"max_read_size": 128 * KIB}}
    )
    assert response.status_code == 200, response.text
    (split,) = (await run_job(client, job))["cells"]
    assert (whole["engine_calls"], split["engine_calls"]) == (4, 32)
    for cell, split_bytes in ((whole, None), (split, 128 * KIB)):
        workload = ModelledWorkload(
            op="read",
            io_bytes=1 << 20,
            count=4,
            dispatch_mode="bio",
            data_unit_size=512,
            split_bytes=split_bytes,
        )
        predicted = predict_workload(
            profile, DeviceModel(name="none"), workload, ModelSpec("aes", "xts", "plain64", 1)
        )
        assert cell["modelled_ms"] == pytest.approx(predicted.total_ns / 1e6, abs=1e-3)
    assert split["modelled_mb_s"] > 3 * whole["modelled_mb_s"]
