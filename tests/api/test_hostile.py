"""Hostile input over the API: each refused with a clear problem, no key echoed, nothing written.

"Nothing written" is checked on everything a request could touch: every SQL row,
the device files (names, sizes, bytes) and the volume's plaintext.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from sqlalchemy import MetaData, select

from app.config import Settings
from tests.support.factories import make_device, make_volume, xts_table
from tests.support.keys import XTS_KEY

pytestmark = pytest.mark.anyio

KEYS = (XTS_KEY, XTS_KEY.upper(), XTS_KEY[:32], XTS_KEY[-32:])


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"max_control_body_bytes": 64 << 10, "max_table_lines": 16, "max_body_bytes": 8192}
    )


@pytest.fixture
async def volume(client: httpx.AsyncClient) -> None:
    await make_device(client, "sda2", 1 << 20)
    await make_volume(client, "v", table=xts_table(sectors=2048, extra=" 1 allow_discards"))
    data = bytes(range(256)) * 16
    response = await client.put(
        "/v1/volumes/v/data", content=data, headers={"Content-Range": "bytes 0-4095/*"}
    )
    assert response.status_code == 204


def sql_rows(app: FastAPI) -> dict[str, list[tuple[Any, ...]]]:
    state = app.state.reqcrypt
    metadata = MetaData()
    metadata.reflect(state.db_engine)
    with state.db_engine.connect() as connection:
        return {
            name: sorted(map(tuple, connection.execute(select(table))), key=repr)
            for name, table in metadata.tables.items()
        }


def device_files(settings: Settings) -> dict[str, str]:
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(Path(settings.devices_dir).glob("*"))
    }


async def snapshot(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings, *, data: bool = True
) -> Any:
    """SQL rows, device files, volumes and (unless suspended) their plaintext."""
    volumes = (await client.get("/v1/volumes")).json()
    plaintext = {
        v["name"]: (await client.get(f"/v1/volumes/{v['name']}/data")).content
        for v in volumes
        if data
    }
    return sql_rows(app), device_files(settings), volumes, plaintext


def assert_refused(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["status"] == response.status_code
    assert problem["detail"]
    for key in KEYS:
        assert key not in response.text


HOSTILE_DEVICES: list[dict[str, Any]] = [
    {"name": "a\x00b", "size_bytes": 4096},
    {"name": "a\nb", "size_bytes": 4096},
    {"name": "\u202eexe.gpj", "size_bytes": 4096},
    {"name": "sd\u0430", "size_bytes": 4096},  # Cyrillic a
    {"name": "..", "size_bytes": 4096},
    {"name": ".", "size_bytes": 4096},
    {"name": "../../etc/passwd", "size_bytes": 4096},
    {"name": "%2e%2e", "size_bytes": 4096},
    {"name": "x" * 65, "size_bytes": 4096},
    {"name": "x", "size_bytes": -512},
    {"name": "x", "size_bytes": 0},
    {"name": "x", "size_bytes": 2**64},
    {"name": "x", "size_bytes": 10**40},
    {"name": "x", "size_bytes": 513},
    {"name": "x", "size_bytes": 4096.5},
    {"name": "x", "size_bytes": "4096"},
]


@pytest.mark.parametrize("body", HOSTILE_DEVICES, ids=repr)
async def test_hostile_device_requests_are_refused_and_create_nothing(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings, volume: None, body: dict[str, Any]
) -> None:
    before = await snapshot(app, client, settings)
    assert_refused(await client.post("/v1/devices", json=body), 422)
    assert await snapshot(app, client, settings) == before


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b'{"name": "x", "size_bytes": ' + b"9" * 5000 + b"}", 400),
        (b'{"name": "x", "size_bytes": 1e400}', 422),
        (b"[" * 50_000, 400),
        (b"\xff\xfe\x00", 400),
        (b'{"name": "x", "size_bytes": 4096, "name": "y"', 422),
    ],
    ids=["5000-digits", "inf", "deep-nesting", "not-utf8", "unterminated"],
)
async def test_malformed_json_is_a_client_error_and_creates_nothing(
    app: FastAPI,
    client: httpx.AsyncClient,
    settings: Settings,
    volume: None,
    raw: bytes,
    status: int,
) -> None:
    before = await snapshot(app, client, settings)
    response = await client.post(
        "/v1/devices", content=raw, headers={"Content-Type": "application/json"}
    )
    assert_refused(response, status)
    assert await snapshot(app, client, settings) == before


HOSTILE_TABLES = [
    f"0 8 crypt aes-xts-plain64 {XTS_KEY[:-1]} 0 sda2 0",  # odd length
    f"0 8 crypt aes-xts-plain64 {XTS_KEY[:-2]} 0 sda2 0",  # wrong length
    f"0 8 crypt aes-xts-plain64 {XTS_KEY[:-2]}zz 0 sda2 0",  # not hex
    f"0 8 crypt aes-xts-plain64 {XTS_KEY[:-2]}\uff10\uff10 0 sda2 0",  # fullwidth digits
    f"0 8 crypt aes-xts-plain64 0x{XTS_KEY[2:]} 0 sda2 0",
    f"0 8 crypt aes-xts-plain64 {XTS_KEY} 0 ../sda2 0",
    f"0 8 crypt aes-xts-plain64 {XTS_KEY} 0 /dev/../sda2 0",
    f"0 8 crypt aes-xts-plain64 {XTS_KEY} 0 /dev/mapper/../../sda2 0",
    f"0 8 crypt aes-xts-plain64 {XTS_KEY} 0 /etc/passwd 0",
    f"0 8 crypt aes-xts-plain64 {XTS_KEY} 0 sda2\x00 0",
    f"0 8 crypt aes-xts-plain64 {XTS_KEY} -1 sda2 0",
    f"0 8 crypt aes-xts-plain64 {XTS_KEY} 0 sda2 -8",
    f"0 8 crypt aes-xts-plain64 {XTS_KEY} 0 sda2 18446744073709551616",
    f"0 8 crypt aes-xts-plain64 {XTS_KEY} 0 sda2 {'9' * 5000}",
    f"0 {'9' * 5000} crypt aes-xts-plain64 {XTS_KEY} 0 sda2 0",
    f"-8 8 crypt aes-xts-plain64 {XTS_KEY} 0 sda2 0",
    f"0 8 crypt aes-xts-plain64 {XTS_KEY} 0 sda2 2048",  # past the device's end
    "0 8 linear sda2 0\n" * 2,  # overlapping lines
    "\n".join(f"{i * 8} 8 linear sda2 {i * 8}" for i in range(17)),  # > max_table_lines
    f"0 8 crypt aes-xts-plain64 {XTS_KEY} 0 sda2 0 1 " + "x" * 5000,  # > line length
    "0 8 zero\u2028",
    "\u0000",
    "",
    " \n# only a comment\n",
]


@pytest.mark.parametrize("table", HOSTILE_TABLES, ids=lambda t: repr(t[:40]))
async def test_hostile_tables_are_refused_without_echoing_keys_and_write_nothing(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings, volume: None, table: str
) -> None:
    before = await snapshot(app, client, settings)
    assert_refused(await client.post("/v1/volumes", json={"name": "w", "table": table}), 422)
    assert_refused(await client.put("/v1/volumes/v/table", json={"table": table}), 422)
    assert await snapshot(app, client, settings) == before


@pytest.mark.parametrize(
    "message",
    [
        f"key set {XTS_KEY[:-1]}",
        f"key set {XTS_KEY[:-2]}zz",
        f"key set {XTS_KEY[:-2]}",
        f"key set {XTS_KEY} {XTS_KEY}",
        f"key set :64:logon:{XTS_KEY}",
        f"key {XTS_KEY}",
        f"key set {XTS_KEY[:-2]}\u0660\u0660",
    ],
)
async def test_malformed_key_messages_are_refused_without_echoing_the_key(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings, volume: None, message: str
) -> None:
    assert (await client.post("/v1/volumes/v/suspend", json={})).status_code == 200
    before = await snapshot(app, client, settings, data=False)
    response = await client.post("/v1/volumes/v/message", json={"message": message})
    assert_refused(response, 422)
    assert await snapshot(app, client, settings, data=False) == before


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("discard", {"offset": -512, "length": 512}, 422),
        ("discard", {"offset": 0, "length": -512}, 422),
        ("discard", {"offset": 2**70, "length": 512}, 416),
        ("discard", {"offset": 512, "length": 2**70}, 416),
        ("discard", {"offset": 2**63 - 512, "length": 2**63}, 416),
        ("write-zeroes", {"offset": 1 << 20, "length": 512}, 416),
        ("write-zeroes", {"offset": 0, "length": 10**40}, 416),
        ("write-zeroes", {"offset": 0.5, "length": 512}, 422),
        ("write-zeroes", {"offset": "0", "length": 512}, 422),
    ],
)
async def test_negative_overflowing_and_huge_offsets_write_nothing(
    app: FastAPI,
    client: httpx.AsyncClient,
    settings: Settings,
    volume: None,
    path: str,
    body: dict[str, Any],
    status: int,
) -> None:
    before = await snapshot(app, client, settings)
    assert_refused(await client.post(f"/v1/volumes/v/{path}", json=body), status)
    assert await snapshot(app, client, settings) == before


@pytest.mark.parametrize(
    ("content_range", "status"),
    [
        ("bytes -1-510/*", 400),
        ("bytes 0--1/*", 400),
        (f"bytes {1 << 20}-{(1 << 20) + 511}/*", 416),
        (f"bytes 0-{'9' * 5000}/*", 416),
        (f"bytes {2**64}-{2**64 + 511}/*", 416),
        ("bytes 0-511/1", 416),
        ("bytes 511-0/*", 400),
        ("bytes 0-511", 400),
        ("bytes=0-511/*", 400),
        ("bytes \u0660-511/*", 400),
    ],
)
async def test_hostile_content_ranges_write_nothing(
    app: FastAPI,
    client: httpx.AsyncClient,
    settings: Settings,
    volume: None,
    content_range: str,
    status: int,
) -> None:
    before = await snapshot(app, client, settings)
    response = await client.put(
        "/v1/volumes/v/data",
        content=b"\xaa" * 512,
        headers={"Content-Range": content_range.encode("utf-8")},  # type: ignore[dict-item]
    )
    assert_refused(response, status)
    assert await snapshot(app, client, settings) == before


async def test_a_body_over_max_body_bytes_is_a_413_before_it_is_read(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings, volume: None
) -> None:
    read: list[int] = []

    async def body() -> AsyncIterator[bytes]:
        read.append(1)
        yield b"\xaa" * 16384

    before = await snapshot(app, client, settings)
    response = await client.put(
        "/v1/volumes/v/data",
        content=body(),
        headers={"Content-Range": "bytes 0-16383/*", "Content-Length": "16384"},
    )
    assert_refused(response, 413)
    assert "16384" in response.json()["detail"]
    assert read == []
    assert await snapshot(app, client, settings) == before


async def test_a_control_body_over_its_limit_is_a_413_from_content_length(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings, volume: None
) -> None:
    before = await snapshot(app, client, settings)
    table = "\n".join(f"{i * 8} 8 zero" for i in range(10_000))
    response = await client.post("/v1/volumes", json={"name": "w", "table": table})
    assert_refused(response, 413)
    assert "REQCRYPT_MAX_CONTROL_BODY_BYTES" in response.json()["detail"]
    assert await snapshot(app, client, settings) == before


async def test_a_chunked_control_body_is_refused_once_past_the_limit(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings, volume: None
) -> None:
    sent = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal sent
        yield b'{"name": "w", "table": "'
        for _ in range(1000):
            sent += 4096
            yield b" " * 4096
        yield b'0 8 zero"}'

    before = await snapshot(app, client, settings)
    response = await client.post(
        "/v1/volumes", content=body(), headers={"Content-Type": "application/json"}
    )
    assert_refused(response, 413)
    assert sent < 1000 * 4096
    assert await snapshot(app, client, settings) == before


async def test_the_data_path_is_not_bound_by_the_control_body_limit(
    client: httpx.AsyncClient, volume: None
) -> None:
    batch = b"--b\r\nContent-Range: bytes 0-0/*\r\n\r\nz\r\n--b--\r\n"
    response = await client.put(
        "/v1/volumes/v/data",
        content=batch,
        headers={"Content-Type": "multipart/byteranges; boundary=b"},
    )
    assert response.status_code == 204


@hypothesis_settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(name=st.text(min_size=1, max_size=70).filter(lambda n: not n.isascii() or "/" in n))
async def test_no_unicode_or_separator_name_creates_a_device(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings, name: str
) -> None:
    before = (sql_rows(app), device_files(settings))
    response = await client.post("/v1/devices", json={"name": name, "size_bytes": 4096})
    assert_refused(response, 422)
    assert (sql_rows(app), device_files(settings)) == before
