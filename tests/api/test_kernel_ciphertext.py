"""Writing a kernel fixture's plaintext over HTTP leaves the device file holding exactly
what the real Linux dm-crypt wrote for the same table (``kernel_fixtures.json``, see
docs/kernel-fixtures.md), for the XTS ciphers other than AES: those take pyca's ECB
between the two whitenings, a write path the AES cases never reach.

The fixtures have no ``sm4-xts-plain64`` case: the oracle's kernel has no sm4 driver
(the case is under ``kernel_refused``). sm4 is checked against an independent XTS model
instead, and that model is itself checked against the kernel's camellia cases."""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.decrepit.ciphers.algorithms import Camellia
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from tests.support.factories import make_device, make_volume
from tests.support.vectors import CASES, FIXTURES, stream

pytestmark = pytest.mark.anyio

DEVICE = "sda2"
NON_AES_XTS = ["camellia-xts-plain64", "capi-xts-camellia-plain64"]
SM4_XTS_KEY = stream("reqcrypt-kfx/sm4-xts-plain64/key0", 32)
SM4_PLAINTEXT = stream("reqcrypt-kfx/sm4-xts-plain64/plaintext", 64 * 1024)
GF_128 = (1 << 128) - 1
UNALIGNED_CUTS = [0, 1, 700, 4097, 20000, 33333, 65535]
"""Where the several-piece write starts each piece: none of them on a sector boundary
after the first, so most pieces read-modify-write a partly written sector."""


def kernel_table(case: dict[str, Any]) -> str:
    """The case's table with the device name for ``{dev}`` and the key recipes' hex."""
    lines = []
    for text in case["table"]:
        for index, recipe in enumerate(case["keys"]):
            text = text.replace(f"{{key{index}}}", stream(recipe["seed"], recipe["size"]).hex())
        lines.append(text.replace("{dev}", DEVICE))
    return "\n".join(lines)


def pieces(size: int) -> list[tuple[int, int]]:
    """``[first, end)`` ranges covering ``[0, size)`` at the unaligned cuts."""
    cuts = [cut for cut in UNALIGNED_CUTS if cut < size] + [size]
    return list(itertools.pairwise(cuts))


def xts_plain64(algorithm: type, key: bytes, data: bytes) -> bytes:
    """Independent model of dm-crypt ``<cipher>-xts-plain64`` at 512-byte sectors from
    sector 0: IEEE P1619 XTS, tweak = E(key2, le128(sector)), times x per block."""
    half = len(key) // 2
    data_ecb = Cipher(algorithm(key[:half]), modes.ECB()).encryptor()
    tweak_ecb = Cipher(algorithm(key[half:]), modes.ECB()).encryptor()
    out = bytearray()
    for sector in range(len(data) // 512):
        tweak = int.from_bytes(tweak_ecb.update(sector.to_bytes(16, "little")), "little")
        tweaks = 0
        for block in range(32):
            tweaks |= tweak << (128 * block)
            tweak = ((tweak << 1) & GF_128) ^ (0x87 if tweak >> 127 else 0)
        plain = int.from_bytes(data[sector * 512 : (sector + 1) * 512], "little")
        crypted = data_ecb.update((plain ^ tweaks).to_bytes(512, "little"))
        out += (int.from_bytes(crypted, "little") ^ tweaks).to_bytes(512, "little")
    return bytes(out)


async def put(client: httpx.AsyncClient, first: int, data: bytes) -> None:
    headers = {"Content-Range": f"bytes {first}-{first + len(data) - 1}/*"}
    response = await client.put("/v1/volumes/vol/data", content=data, headers=headers)
    assert response.status_code == 204, response.text


def test_sm4_xts_has_no_kernel_fixture_because_the_oracle_kernel_refused_it() -> None:
    assert "sm4-xts-plain64" not in CASES
    refused = {entry["name"]: entry for entry in FIXTURES["kernel_refused"]}
    assert "Error allocating crypto tfm (-ENOENT)" in refused["sm4-xts-plain64"]["kernel_message"]


@pytest.mark.parametrize("name", NON_AES_XTS)
def test_the_independent_xts_model_gives_the_kernels_camellia_ciphertext(name: str) -> None:
    case = CASES[name]
    key = stream(case["keys"][0]["seed"], case["keys"][0]["size"])
    plaintext = stream(case["plaintext"]["seed"], case["plaintext"]["size"])
    ciphertext = xts_plain64(Camellia, key, plaintext)
    assert hashlib.sha256(ciphertext).hexdigest() == case["kernel"]["backing_sha256"]


@pytest.mark.parametrize("split", [False, True], ids=["one-write", "unaligned-pieces"])
@pytest.mark.parametrize("name", NON_AES_XTS)
async def test_device_file_holds_the_kernels_ciphertext_after_an_http_write(
    client: httpx.AsyncClient, data_dir: Path, name: str, split: bool
) -> None:
    case = CASES[name]
    assert "backing_init" not in case  # a fresh device is zero-filled, like the kernel's
    size = case["plaintext"]["size"]
    plaintext = stream(case["plaintext"]["seed"], size)
    await make_device(client, DEVICE, case["backing_size"])
    await make_volume(client, table=kernel_table(case))

    for first, end in pieces(size) if split else [(0, size)]:
        await put(client, first, plaintext[first:end])
    assert (await client.post("/v1/volumes/vol/flush")).status_code == 204

    image = (data_dir / "devices" / f"{DEVICE}.img").read_bytes()
    assert len(image) == case["backing_size"]
    assert hashlib.sha256(image).hexdigest() == case["kernel"]["backing_sha256"]
    response = await client.get("/v1/volumes/vol/data", headers={"Range": f"bytes=0-{size - 1}"})
    assert response.status_code == 206, response.text
    assert response.content == plaintext


@pytest.mark.parametrize("split", [False, True], ids=["one-write", "unaligned-pieces"])
async def test_sm4_xts_device_file_holds_the_xts_models_ciphertext_after_an_http_write(
    client: httpx.AsyncClient, data_dir: Path, split: bool
) -> None:
    size = len(SM4_PLAINTEXT)
    await make_device(client, DEVICE, size)
    table = f"0 {size // 512} crypt sm4-xts-plain64 {SM4_XTS_KEY.hex()} 0 {DEVICE} 0"
    await make_volume(client, table=table)

    for first, end in pieces(size) if split else [(0, size)]:
        await put(client, first, SM4_PLAINTEXT[first:end])
    assert (await client.post("/v1/volumes/vol/flush")).status_code == 204

    image = (data_dir / "devices" / f"{DEVICE}.img").read_bytes()
    assert image == xts_plain64(algorithms.SM4, SM4_XTS_KEY, SM4_PLAINTEXT)
    response = await client.get("/v1/volumes/vol/data", headers={"Range": f"bytes=0-{size - 1}"})
    assert response.status_code == 206, response.text
    assert response.content == SM4_PLAINTEXT
