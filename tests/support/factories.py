"""Plain factory helpers for API tests."""

from __future__ import annotations

import httpx

from tests.support.keys import XTS_KEY


def xts_table(device: str = "sda2", sectors: int = 2048, extra: str = "") -> str:
    return f"0 {sectors} crypt aes-xts-plain64 {XTS_KEY} 0 {device} 0{extra}"


async def make_device(client: httpx.AsyncClient, name: str = "sda2", size: int = 1 << 20) -> None:
    response = await client.post("/v1/devices", json={"name": name, "size_bytes": size})
    assert response.status_code == 201, response.text


async def make_volume(
    client: httpx.AsyncClient, name: str = "vol", table: str | None = None, **fields: object
) -> dict[str, object]:
    response = await client.post(
        "/v1/volumes", json={"name": name, "table": table or xts_table(), **fields}
    )
    assert response.status_code == 201, response.text
    body: dict[str, object] = response.json()
    return body
