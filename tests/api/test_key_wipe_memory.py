"""Through the API, a key that leaves a volume (``key wipe``, ``key set``, a table swap,
a reload of the inactive slot, remove) is zeroed in memory, not only dereferenced."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI

from app.crypto.keys import KeyMaterial
from app.dm.table import CryptParams, Table
from tests.support.factories import make_device, make_volume, xts_table
from tests.support.keys import CBC_KEY

pytestmark = pytest.mark.anyio


def key_buffers(app: FastAPI, table: Table | None) -> list[bytearray]:
    """The bytearrays behind every crypt key of ``table`` (live or inactive)."""
    assert table is not None
    keys = [line.target.key for line in table.lines if isinstance(line.target, CryptParams)]
    assert keys
    assert all(isinstance(key, KeyMaterial) for key in keys)
    return [key._data for key in keys if key is not None]


def live_buffers(app: FastAPI, name: str) -> list[bytearray]:
    volume = app.state.reqcrypt.control.volume(name)
    buffers = key_buffers(app, volume.live.table)
    transform = volume.live.targets[0].transform
    return [*buffers, transform._key._data, *transform._subkeys]


def zeroed(buffers: list[bytearray]) -> bool:
    return all(len(buffer) and not any(buffer) for buffer in buffers)


async def test_key_wipe_zeroes_the_table_key_and_the_transforms_copies(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    await make_device(client)
    await make_volume(client)
    buffers = live_buffers(app, "vol")
    assert not any(zeroed([buffer]) for buffer in buffers)
    await client.post("/v1/volumes/vol/suspend")
    wiped = await client.post("/v1/volumes/vol/message", json={"message": "key wipe"})
    assert wiped.status_code == 204
    assert zeroed(buffers)


async def test_key_set_zeroes_the_key_it_replaces(app: FastAPI, client: httpx.AsyncClient) -> None:
    await make_device(client)
    await make_volume(client)
    buffers = live_buffers(app, "vol")
    await client.post("/v1/volumes/vol/suspend")
    new_key = "ab" * 64
    response = await client.post("/v1/volumes/vol/message", json={"message": f"key set {new_key}"})
    assert response.status_code == 204
    assert zeroed(buffers)
    assert not zeroed(live_buffers(app, "vol"))


async def test_table_swaps_reloads_and_remove_zero_the_keys_they_drop(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    await make_device(client)
    await make_volume(client)
    control = app.state.reqcrypt.control
    old_live = live_buffers(app, "vol")
    await client.put("/v1/volumes/vol/table", json={"table": xts_table()})
    first_inactive = key_buffers(app, control.volume("vol").inactive)
    essiv = f"0 2048 crypt aes-cbc-essiv:sha256 {CBC_KEY} 0 sda2 0"
    await client.put("/v1/volumes/vol/table", json={"table": essiv})
    assert zeroed(first_inactive)
    assert not zeroed(old_live)

    resumed = await client.post("/v1/volumes/vol/resume")
    assert resumed.status_code == 200
    assert zeroed(old_live)
    new_live = live_buffers(app, "vol")
    await client.put("/v1/volumes/vol/table", json={"table": xts_table()})
    inactive = key_buffers(app, control.volume("vol").inactive)
    assert (await client.delete("/v1/volumes/vol")).status_code == 204
    assert zeroed(new_live)
    assert zeroed(inactive)
