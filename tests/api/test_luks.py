"""LUKS over HTTP: cryptsetup images in, reqcrypt images out, hostile headers refused.

Images travel the way docs/compatibility.md tells users: through a ``linear`` volume
over the device, as HTTP PUT and GET of the bytes.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import logging
import re
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from app.config import Settings
from app.luks import device as luks_device
from app.luks.device import write_header
from app.luks.header import read_header
from app.luks.kdf import Kdf, KdfCeiling
from app.storage.file import FileStore
from tests import cryptsetup
from tests.support.app import running

pytestmark = pytest.mark.anyio

SIZE = 32 << 20
PASSPHRASE = "correct horse battery staple"
CHEAP_ARGON2 = {"type": "argon2id", "iterations": 4, "memory_kib": 32768, "parallel": 1}
CHEAP_PBKDF2 = {"type": "pbkdf2", "iterations": 1000}
SALT = base64.b64encode(b"saltsalt").decode()


async def put_image(client: httpx.AsyncClient, device: str, data: bytes) -> None:
    """Bring bytes in through a linear volume over the whole device (then unmap it)."""
    table = f"0 {len(data) // 512} linear {device} 0"
    response = await client.post("/v1/volumes", json={"name": "carrier", "table": table})
    assert response.status_code == 201, response.text
    response = await client.put(
        "/v1/volumes/carrier/data",
        content=data,
        headers={"Content-Range": f"bytes 0-{len(data) - 1}/*"},
    )
    assert response.status_code == 204, response.text
    assert (await client.post("/v1/volumes/carrier/flush")).status_code == 204
    assert (await client.delete("/v1/volumes/carrier")).status_code == 204


async def get_image(client: httpx.AsyncClient, device: str, size: int = SIZE) -> bytes:
    table = f"0 {size // 512} linear {device} 0"
    response = await client.post("/v1/volumes", json={"name": "carrier", "table": table})
    assert response.status_code == 201, response.text
    response = await client.get("/v1/volumes/carrier/data")
    assert response.status_code == 200
    assert (await client.delete("/v1/volumes/carrier")).status_code == 204
    return response.content


async def device_with(client: httpx.AsyncClient, name: str, image: Path) -> None:
    response = await client.post("/v1/devices", json={"name": name, "size_bytes": SIZE})
    assert response.status_code == 201, response.text
    await put_image(client, name, image.read_bytes())


async def luks_open(
    client: httpx.AsyncClient, name: str, device: str, passphrase: str = PASSPHRASE
) -> httpx.Response:
    return await client.post(
        "/v1/volumes", json={"name": name, "luks": {"device": device, "passphrase": passphrase}}
    )


def xts_decrypt(key: bytes, data: bytes, first_sector: int, sector_size: int) -> bytes:
    """dm-crypt's aes-xts-plain64 by pyca: each data unit's tweak is its 512-byte sector."""
    out = bytearray()
    for index in range(len(data) // sector_size):
        sector = first_sector + index * (sector_size // 512)
        decryptor = Cipher(
            algorithms.AES(key), modes.XTS(sector.to_bytes(16, "little"))
        ).decryptor()
        out += decryptor.update(data[index * sector_size : (index + 1) * sector_size])
    return bytes(out)


@pytest.mark.parametrize(
    ("kind", "pbkdf", "sector_size"),
    [
        ("luks1", "pbkdf2", 512),
        ("luks2", "argon2id", 512),
        ("luks2", "argon2id", 4096),
        ("luks2", "pbkdf2", 4096),
    ],
)
async def test_data_written_through_a_cryptsetup_image_decrypts_with_cryptsetups_key(
    client: httpx.AsyncClient, tmp_path: Path, kind: str, pbkdf: str, sector_size: int
) -> None:
    image = cryptsetup.image(tmp_path / "disk.img", SIZE)
    cryptsetup.luks_format(
        image, PASSPHRASE.encode(), kind=kind, pbkdf=pbkdf, sector_size=sector_size
    )
    key = cryptsetup.volume_key(image, PASSPHRASE.encode())
    offset = 4096 * 512 if kind == "luks1" else 16 << 20
    await device_with(client, "sda2", image)

    response = await luks_open(client, "secret", "sda2")
    assert response.status_code == 201, response.text
    sectors = (SIZE - offset) // 512
    options = f" 1 sector_size:{sector_size}" if sector_size != 512 else ""
    masked = await client.get("/v1/volumes/secret/table")
    expected = f"0 {sectors} crypt aes-xts-plain64 {{}} 0 sda2 {offset // 512}{options}\n"
    assert masked.text == expected.format("0" * 128)
    shown = await client.get("/v1/volumes/secret/table", params={"show_keys": "true"})
    assert shown.text == expected.format(key.hex())

    plaintext = bytes(range(256)) * 64
    response = await client.put(
        "/v1/volumes/secret/data",
        content=plaintext,
        headers={"Content-Range": f"bytes 8192-{8192 + len(plaintext) - 1}/*"},
    )
    assert response.status_code == 204
    await client.delete("/v1/volumes/secret")
    raw = await get_image(client, "sda2")
    ciphertext = raw[offset + 8192 : offset + 8192 + len(plaintext)]
    assert xts_decrypt(key, ciphertext, 16, sector_size) == plaintext


async def test_an_image_formatted_over_http_opens_in_cryptsetup(
    client: httpx.AsyncClient, tmp_path: Path
) -> None:
    await client.post("/v1/devices", json={"name": "sdb", "size_bytes": SIZE})
    response = await client.post(
        "/v1/devices/sdb/luks",
        json={
            "passphrase": PASSPHRASE,
            "sector_size": 4096,
            "pbkdf": CHEAP_ARGON2,
            "label": "data",
        },
    )
    assert response.status_code == 201, response.text
    dump = response.json()
    assert (dump["version"], dump["label"], dump["sector_size"]) == (2, "data", 4096)
    assert dump["keyslots"][0]["pbkdf"] == {
        "type": "argon2id",
        "iterations": 4,
        "memory_kib": 32768,
        "parallel": 1,
    }
    response = await client.post(
        "/v1/devices/sdb/luks/keyslots",
        json={"passphrase": PASSPHRASE, "new_passphrase": "second", "pbkdf": CHEAP_PBKDF2},
    )
    assert response.status_code == 201, response.text
    assert response.json()["slot"] == 1
    assert (await luks_open(client, "v", "sdb")).status_code == 201
    key = (await client.get("/v1/volumes/v/table", params={"show_keys": "true"})).text.split()[4]
    await client.delete("/v1/volumes/v")

    image = tmp_path / "out.img"
    image.write_bytes(await get_image(client, "sdb"))
    assert "Label:" in cryptsetup.run("luksDump", str(image))
    assert cryptsetup.opens(image, PASSPHRASE.encode())
    assert cryptsetup.opens(image, b"second")
    assert cryptsetup.volume_key(image, b"second").hex() == key


async def test_a_slot_cryptsetup_adds_opens_over_http(
    client: httpx.AsyncClient, tmp_path: Path
) -> None:
    image = cryptsetup.image(tmp_path / "disk.img", SIZE)
    cryptsetup.luks_format(image, PASSPHRASE.encode(), kind="luks2", pbkdf="argon2id")
    cryptsetup.add_key(image, PASSPHRASE.encode(), b"\x00binary\xffkey", pbkdf="pbkdf2")
    await device_with(client, "sda2", image)
    key_file = base64.b64encode(b"\x00binary\xffkey").decode()
    response = await client.post(
        "/v1/volumes", json={"name": "v", "luks": {"device": "sda2", "key_file": key_file}}
    )
    assert response.status_code == 201, response.text


async def test_a_wrong_passphrase_is_403_with_no_slot_named_and_no_volume(
    client: httpx.AsyncClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    image = cryptsetup.image(tmp_path / "disk.img", SIZE)
    cryptsetup.luks_format(image, PASSPHRASE.encode(), kind="luks2", pbkdf="argon2id")
    await device_with(client, "sda2", image)
    caplog.set_level(logging.DEBUG)
    response = await luks_open(client, "v", "sda2", "not the passphrase")
    assert response.status_code == 403
    assert response.headers["content-type"] == "application/problem+json"
    assert "slot" not in response.json()["detail"].replace("keyslot opens", "")
    assert (await client.get("/v1/volumes/v")).status_code == 404
    assert "not the passphrase" not in caplog.text


async def test_the_dump_never_shows_key_material_and_a_blank_device_is_404(
    client: httpx.AsyncClient,
) -> None:
    await client.post("/v1/devices", json={"name": "sdb", "size_bytes": SIZE})
    response = await client.get("/v1/devices/sdb/luks")
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"
    await client.post(
        "/v1/devices/sdb/luks", json={"passphrase": PASSPHRASE, "pbkdf": CHEAP_ARGON2}
    )
    dump = (await client.get("/v1/devices/sdb/luks")).json()
    assert "salt" not in str(dump)
    assert PASSPHRASE not in str(dump)
    assert dump["data_offset"] == 16 << 20


async def test_the_last_keyslot_is_killed_only_with_force(client: httpx.AsyncClient) -> None:
    await client.post("/v1/devices", json={"name": "sdb", "size_bytes": SIZE})
    await client.post(
        "/v1/devices/sdb/luks", json={"passphrase": PASSPHRASE, "pbkdf": CHEAP_ARGON2}
    )
    await client.post(
        "/v1/devices/sdb/luks/keyslots",
        json={"passphrase": PASSPHRASE, "new_passphrase": "second", "pbkdf": CHEAP_ARGON2},
    )
    wrong = await client.request(
        "DELETE", "/v1/devices/sdb/luks/keyslots/0", json={"passphrase": "x"}
    )
    assert wrong.status_code == 403
    killed = await client.request(
        "DELETE", "/v1/devices/sdb/luks/keyslots/0", json={"passphrase": "second"}
    )
    assert killed.status_code == 204
    assert (await luks_open(client, "v", "sdb")).status_code == 403
    last = await client.request("DELETE", "/v1/devices/sdb/luks/keyslots/1", json={})
    assert last.status_code == 409
    forced = await client.request("DELETE", "/v1/devices/sdb/luks/keyslots/1", json={"force": True})
    assert forced.status_code == 204
    assert (await client.get("/v1/devices/sdb/luks")).json()["keyslots"] == []


async def test_a_device_is_not_deleted_under_a_luks_format_that_is_writing_its_header(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A format derives its key outside the control lock: a delete meanwhile would close
    the descriptor it writes through (and a reused number is another file)."""
    await client.post("/v1/devices", json={"name": "sdb", "size_bytes": SIZE})
    started, release = threading.Event(), threading.Event()
    format_device = luks_device.format_device

    def held_format(*args: Any, **kwargs: Any) -> Any:
        started.set()
        release.wait(30)
        return format_device(*args, **kwargs)

    monkeypatch.setattr("app.api.routes.luks.format_device", held_format)
    formatting = asyncio.create_task(
        client.post("/v1/devices/sdb/luks", json={"passphrase": PASSPHRASE, "pbkdf": CHEAP_ARGON2})
    )
    await asyncio.to_thread(started.wait, 30)
    refused = await client.delete("/v1/devices/sdb")
    release.set()
    assert refused.status_code == 409
    assert "LUKS operation" in refused.json()["detail"]
    assert (await formatting).status_code == 201
    assert (await client.get("/v1/devices/sdb/luks")).status_code == 200
    assert (await client.delete("/v1/devices/sdb")).status_code == 204


async def test_formatting_a_mapped_device_is_refused(client: httpx.AsyncClient) -> None:
    await client.post("/v1/devices", json={"name": "sdb", "size_bytes": SIZE})
    await client.post("/v1/volumes", json={"name": "lin", "table": "0 8 linear sdb 0"})
    response = await client.post(
        "/v1/devices/sdb/luks", json={"passphrase": PASSPHRASE, "pbkdf": CHEAP_ARGON2}
    )
    assert response.status_code == 409


async def test_a_header_with_a_requirement_flag_is_refused_and_nothing_written(
    client: httpx.AsyncClient, tmp_path: Path
) -> None:
    image = cryptsetup.image(tmp_path / "disk.img", SIZE)
    cryptsetup.luks_format(image, PASSPHRASE.encode(), kind="luks2", pbkdf="argon2id")
    await device_with(client, "sda2", image)
    data = await get_image(client, "sda2")
    locked = bytearray(data)
    # a LUKS2 header whose config names a mandatory requirement reqcrypt does not know
    for base in (0, 16384):
        area = bytes(locked[base + 4096 : base + 16384]).split(b"\0", 1)[0]
        edited = area.replace(
            b'"config":{', b'"config":{"requirements":{"mandatory":["online-reencrypt-v2"]},'
        )
        locked[base + 4096 : base + 4096 + len(edited)] = edited
        copy = bytearray(locked[base : base + 16384])
        copy[448:512] = bytes(64)
        locked[base + 448 : base + 480] = hashlib.sha256(copy).digest()
    await put_image(client, "sda2", bytes(locked))
    before = await get_image(client, "sda2")
    response = await luks_open(client, "v", "sda2")
    assert response.status_code == 422
    assert "requirement" in response.json()["detail"]
    response = await client.post(
        "/v1/devices/sda2/luks/keyslots",
        json={"passphrase": PASSPHRASE, "new_passphrase": "x", "pbkdf": CHEAP_ARGON2},
    )
    assert response.status_code == 422
    assert await get_image(client, "sda2") == before


async def test_a_pbkdf_cost_over_the_ceiling_is_422_and_nothing_written(settings: Settings) -> None:
    settings.luks_max_pbkdf_memory_kib = 16384
    async with running(settings) as http:
        await http.post("/v1/devices", json={"name": "sdb", "size_bytes": SIZE})
        response = await http.post(
            "/v1/devices/sdb/luks", json={"passphrase": PASSPHRASE, "pbkdf": CHEAP_ARGON2}
        )
        assert response.status_code == 422
        assert "REQCRYPT_LUKS_MAX_PBKDF_MEMORY_KIB" in response.json()["detail"]
        assert (await http.get("/v1/devices/sdb")).json()["allocated_bytes"] == 0


async def test_a_luks_volume_survives_a_restart_without_its_passphrase(settings: Settings) -> None:
    async with running(settings) as http:
        await http.post("/v1/devices", json={"name": "sdb", "size_bytes": SIZE})
        await http.post(
            "/v1/devices/sdb/luks", json={"passphrase": PASSPHRASE, "pbkdf": CHEAP_ARGON2}
        )
        assert (await luks_open(http, "v", "sdb")).status_code == 201
        table = (await http.get("/v1/volumes/v/table", params={"show_keys": "true"})).text
    async with running(settings) as http:
        restored = await http.get("/v1/volumes/v/table", params={"show_keys": "true"})
        assert restored.text == table
    for path in Path(settings.data_dir).rglob("*"):
        if path.is_file() and path.suffix != ".img":
            assert PASSPHRASE.encode() not in path.read_bytes()


async def test_key_derivations_run_one_at_a_time_and_leave_the_loop_free(
    client: httpx.AsyncClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await client.post("/v1/devices", json={"name": "sdb", "size_bytes": SIZE})
    await client.post(
        "/v1/devices/sdb/luks", json={"passphrase": PASSPHRASE, "pbkdf": CHEAP_ARGON2}
    )
    running = 0
    most = 0
    lock = threading.Lock()
    derive = Kdf.derive

    def counted(self: Kdf, *args: Any) -> bytearray:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        try:
            return derive(self, *args)
        finally:
            with lock:
                running -= 1

    monkeypatch.setattr(Kdf, "derive", counted)
    opens = [asyncio.ensure_future(luks_open(client, f"v{i}", "sdb", "wrong")) for i in range(6)]
    health = await client.get("/healthz")
    answers = await asyncio.gather(*opens)
    assert health.status_code == 200
    assert [answer.status_code for answer in answers] == [403] * 6
    assert most == 1


async def test_an_iter_time_times_the_pbkdf_of_new_keyslots(client: httpx.AsyncClient) -> None:
    await client.post("/v1/devices", json={"name": "sdb", "size_bytes": SIZE})
    response = await client.post(
        "/v1/devices/sdb/luks",
        json={"passphrase": PASSPHRASE, "pbkdf": {"type": "pbkdf2", "iter_time_ms": 20}},
    )
    assert response.status_code == 201, response.text
    iterations = response.json()["keyslots"][0]["pbkdf"]["iterations"]
    assert 1000 < iterations < 1_000_000  # timed: neither the floor nor the fixed default
    response = await client.post(
        "/v1/devices/sdb/luks/keyslots",
        json={
            "passphrase": PASSPHRASE,
            "new_passphrase": "second",
            "pbkdf": {"type": "argon2id", "memory_kib": 8192, "parallel": 1, "iter_time_ms": 30},
        },
    )
    assert response.status_code == 201, response.text
    added = response.json()["dump"]["keyslots"][1]["pbkdf"]
    assert added["memory_kib"] == 8192
    assert added["iterations"] >= 4
    assert (await luks_open(client, "v", "sdb", "second")).status_code == 201


async def test_an_iter_time_with_iterations_is_422(client: httpx.AsyncClient) -> None:
    await client.post("/v1/devices", json={"name": "sdb", "size_bytes": SIZE})
    response = await client.post(
        "/v1/devices/sdb/luks",
        json={"passphrase": PASSPHRASE, "pbkdf": {**CHEAP_PBKDF2, "iter_time_ms": 20}},
    )
    assert response.status_code == 422
    assert "iter_time_ms" in response.json()["detail"]


async def test_a_timed_pbkdf_stays_under_the_ceiling(settings: Settings) -> None:
    settings.luks_max_pbkdf_iterations = 2000
    async with running(settings) as http:
        await http.post("/v1/devices", json={"name": "sdb", "size_bytes": SIZE})
        response = await http.post(
            "/v1/devices/sdb/luks",
            json={"passphrase": PASSPHRASE, "pbkdf": {"type": "pbkdf2", "iter_time_ms": 1000}},
        )
        assert response.status_code == 201, response.text
        assert response.json()["keyslots"][0]["pbkdf"]["iterations"] == 2000


def with_costly_keyslots(image: Path, count: int) -> None:
    """``count`` more keyslots bound to the volume key, each within the default per-keyslot
    ceilings (argon2id, 1 GiB, 8 passes: seconds each), written without deriving any."""
    disk = FileStore(image, image.stat().st_size)
    header = read_header(disk, KdfCeiling())
    model = header.metadata["keyslots"]["0"]
    for number in range(1, count + 1):
        slot = copy.deepcopy(model)
        slot["area"]["offset"] = str(int(model["area"]["offset"]) + number * 258048)
        slot["kdf"] = {"type": "argon2id", "time": 8, "memory": 1 << 20, "cpus": 4, "salt": SALT}
        header.metadata["keyslots"][str(number)] = slot
        header.metadata["digests"]["0"]["keyslots"].append(str(number))
    write_header(disk, header)


@pytest.mark.parametrize(
    ("method", "path", "body", "tried"),
    [
        ("POST", "/v1/volumes", {"name": "v", "luks": {"device": "sda2", "passphrase": "x"}}, 32),
        ("POST", "/v1/devices/sda2/luks/keyslots", {"passphrase": "x", "new_passphrase": "y"}, 32),
        ("DELETE", "/v1/devices/sda2/luks/keyslots/0", {"passphrase": "x"}, 31),  # not slot 0
    ],
)
async def test_an_unlock_costing_more_than_the_total_ceiling_is_422_before_any_derivation(
    client: httpx.AsyncClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    method: str,
    path: str,
    body: dict[str, Any],
    tried: int,
) -> None:
    image = cryptsetup.image(tmp_path / "disk.img", SIZE)
    cryptsetup.luks_format(image, PASSPHRASE.encode(), kind="luks2", pbkdf="pbkdf2")
    with_costly_keyslots(image, 31)
    await device_with(client, "sda2", image)

    def no_derivation(*args: Any) -> bytearray:
        raise AssertionError("a key derivation ran")

    monkeypatch.setattr(Kdf, "derive", no_derivation)
    monkeypatch.setattr(luks_device, "pbkdf2", no_derivation)
    response = await client.request(method, path, json=body)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert re.search(
        rf"{tried} keyslot\(s\).*: [\d,]+ units .* ceiling of 200,000,000 "
        r"\(REQCRYPT_LUKS_MAX_UNLOCK_WORK\)",
        response.json()["detail"],
    )


async def test_a_luks1_header_at_cryptsetups_default_cost_opens_within_the_default_ceiling(
    client: httpx.AsyncClient, tmp_path: Path
) -> None:
    image = cryptsetup.image(tmp_path / "disk.img", SIZE)
    cryptsetup.run(
        "luksFormat",
        "--type",
        "luks1",
        "--pbkdf-force-iterations",
        "1000000",
        str(image),
        passphrase=PASSPHRASE.encode(),
    )
    await device_with(client, "sda2", image)
    assert (await luks_open(client, "v", "sda2")).status_code == 201


async def test_argon2_memory_under_8_kib_a_thread_is_422_before_the_iter_time_is_timed(
    client: httpx.AsyncClient,
) -> None:
    """A 500 the contract fuzzer met (issue #44): timing an Argon2 derivation for
    ``iter_time_ms`` ran it with less than the 8 KiB per thread Argon2 needs, before the
    memory was checked."""
    await client.post("/v1/devices", json={"name": "sdb", "size_bytes": (16 << 20) + 512})
    assert (await client.get("/v1/devices/sdb/luks")).status_code == 404
    body = {
        "key_file": base64.b64encode(b"key file").decode(),
        "sector_size": 512,
        "pbkdf": {"memory_kib": 64, "parallel": 16, "iter_time_ms": 1},
    }
    response = await client.post("/v1/devices/sdb/luks", json=body)
    assert response.status_code == 422, response.text
    assert "8 KiB per thread" in response.json()["detail"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/devices/sdb/luks", b'{"passphrase": "\\ud800"}'),
        ("/v1/devices/sdb/luks/keyslots", b'{"passphrase": "x", "new_passphrase": "\\udfff"}'),
    ],
)
async def test_a_passphrase_with_a_lone_surrogate_is_422(
    client: httpx.AsyncClient, path: str, body: bytes
) -> None:
    """JSON may escape half a UTF-16 pair, which no UTF-8 text holds (it was a 500)."""
    await client.post("/v1/devices", json={"name": "sdb", "size_bytes": SIZE})
    response = await client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert "lone surrogate" in response.json()["detail"]
