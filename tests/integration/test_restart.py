"""A restart restores every device and volume in the same state, on SQLite and PostgreSQL."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.config import Settings
from tests.support.app import ADMIN_TOKEN, running
from tests.support.factories import xts_table
from tests.support.keys import CBC_KEY, XTS_KEY

pytestmark = pytest.mark.anyio


@pytest.fixture
def restart_settings(database_url: str, data_dir: Path) -> Settings:
    """One service's settings, reused across its restarts."""
    return Settings(
        data_dir=data_dir,
        database_url=database_url,
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
    )


async def test_restart_restores_states_tables_keys_and_data(restart_settings: Settings) -> None:
    payload = os.urandom(8192)
    async with running(restart_settings) as client:
        await client.post("/v1/devices", json={"name": "pv", "size_bytes": 4 << 20})
        await client.post("/v1/volumes", json={"name": "live", "table": xts_table("pv", 2048)})
        put = await client.put(
            "/v1/volumes/live/data",
            content=payload,
            headers={"Content-Range": "bytes 0-8191/*"},
        )
        assert put.status_code == 204
        essiv = f"0 2048 crypt aes-cbc-essiv:sha256 {CBC_KEY} 0 pv 2048"
        await client.post(
            "/v1/volumes",
            json={"name": "held", "table": essiv, "dispatch_mode": "bio", "plug_window_us": 777},
        )
        await client.post("/v1/volumes/held/suspend")
        await client.post("/v1/volumes/held/message", json={"message": "key wipe"})
        await client.put("/v1/volumes/live/table", json={"table": xts_table("pv", 1024)})
        await client.post(
            "/v1/volumes", json={"name": "top", "table": "0 2048 linear /dev/mapper/live 0"}
        )
        before = {
            name: (await client.get(f"/v1/volumes/{name}")).json()
            for name in ("live", "held", "top")
        }

    async with running(restart_settings) as client:
        for name, info in before.items():
            assert (await client.get(f"/v1/volumes/{name}")).json() == info
        assert before["held"]["state"] == "suspended"
        assert before["held"]["dispatch_mode"] == "bio"
        assert before["held"]["plug_window_us"] == 777
        assert before["live"]["plug_window_us"] == 50
        assert before["live"]["tables"] == ["LIVE", "INACTIVE"]
        live_table = await client.get("/v1/volumes/live/table", params={"show_keys": "true"})
        assert live_table.text == f"0 2048 crypt aes-xts-plain64 {XTS_KEY} 0 pv 0\n"
        data = await client.get("/v1/volumes/top/data", headers={"Range": "bytes=0-8191"})
        assert data.content == payload
        refused = await client.post("/v1/volumes/held/resume")
        assert refused.status_code == 409
        assert "crypt key is not set" in refused.json()["detail"]
        await client.post("/v1/volumes/held/message", json={"message": f"key set {CBC_KEY}"})
        assert (await client.post("/v1/volumes/held/resume")).json()["state"] == "active"
        assert (await client.get("/v1/devices/pv")).json()["mapped_by"] == ["held", "live"]


async def test_a_service_restarts_after_renaming_a_volume_an_inactive_table_maps(
    restart_settings: Settings,
) -> None:
    """Every accepted call leaves a deployment that restarts: no table names a missing volume."""
    async with running(restart_settings) as client:
        await client.post("/v1/devices", json={"name": "pv", "size_bytes": 1 << 20})
        await client.post("/v1/volumes", json={"name": "lower", "table": xts_table("pv", 2048)})
        await client.post("/v1/volumes", json={"name": "upper", "table": "0 2048 zero"})
        await client.put(
            "/v1/volumes/upper/table", json={"table": "0 2048 linear /dev/mapper/lower 0"}
        )
        await client.post("/v1/volumes/lower/rename", json={"new_name": "renamed"})
        before = sorted(v["name"] for v in (await client.get("/v1/volumes")).json())

    async with running(restart_settings) as client:
        after = sorted(v["name"] for v in (await client.get("/v1/volumes")).json())
        assert after == before
        resumed = await client.post("/v1/volumes/upper/resume")
        assert resumed.status_code == 200, resumed.text


async def test_keys_are_stored_only_wrapped(restart_settings: Settings, database_url: str) -> None:
    from sqlalchemy import create_engine, text

    async with running(restart_settings) as client:
        await client.post("/v1/devices", json={"name": "pv", "size_bytes": 1 << 20})
        await client.post("/v1/volumes", json={"name": "v", "table": xts_table("pv", 2048)})
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as connection:
        texts = [row[0] for row in connection.execute(text("SELECT text FROM volume_tables"))]
        blobs = [bytes(row[0]) for row in connection.execute(text("SELECT blob FROM wrapped_keys"))]
    engine.dispose()
    assert texts == [f"0 2048 crypt aes-xts-plain64 {'0' * 128} 0 pv 0\n"]
    assert len(blobs) == 1
    assert bytes.fromhex(XTS_KEY) not in blobs[0]


async def test_custom_engines_and_device_models_survive_a_restart(
    restart_settings: Settings,
) -> None:
    engine = {
        "name": "asic",
        "capabilities": {"bulk_ivmodes": ["plain64"], "max_bytes_per_call": 65536},
        "cost": {"setup_ns": 2000, "encrypt_bytes_per_s": 2e8, "decrypt_bytes_per_s": 3e8},
    }
    async with running(restart_settings) as client:
        assert (await client.post("/v1/engines", json=engine)).status_code == 201
        model = {"name": "nvme", "read_latency_ns": 80000, "write_latency_ns": 20000}
        assert (await client.post("/v1/device-models", json=model)).status_code == 201
        before = (await client.get("/v1/engines/asic")).json()
    async with running(restart_settings) as client:
        after = (await client.get("/v1/engines/asic")).json()
        assert after["capabilities"] == before["capabilities"]
        assert after["cost"] == before["cost"]
        nvme = (await client.get("/v1/device-models/nvme")).json()
        assert nvme["read_latency_ns"] == 80000
