"""Ranged reads and writes over HTTP (ASGI transport), on a file device and on an RBD
image (the throwaway Ceph cluster of ``tests/support/ceph.py``): the data path is the same."""

import os
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from app.config import Settings
from tests.support import ceph
from tests.support.factories import make_volume, xts_table
from tests.support.keys import XTS_KEY

pytestmark = pytest.mark.anyio
SIZE = 2048 * 512
MakeDevice = Callable[[httpx.AsyncClient], Awaitable[None]]


@pytest.fixture(params=["file", pytest.param("rbd", marks=pytest.mark.ceph)])
def store(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def prefix() -> str:
    """Image names of one test, apart from every other test's in the shared pool."""
    return f"t{uuid.uuid4().hex[:8]}-"


@pytest.fixture
def settings(settings: Settings, request: pytest.FixtureRequest, prefix: str) -> Iterator[Settings]:
    """The service with a Ceph cluster where the test's device is an RBD image."""
    if "store" not in request.fixturenames or request.getfixturevalue("store") != "rbd":
        yield settings
        return
    cluster: ceph.Cluster = request.getfixturevalue("ceph_cluster")
    yield settings.model_copy(update={"ceph_conf": cluster.conf, "rbd_image_prefix": prefix})
    for image in cluster.images():
        if image.startswith(prefix):
            cluster.run("rbd", "rm", f"{ceph.POOL}/{image}")


@pytest.fixture
def make_device(store: str) -> MakeDevice:
    """``sda2``, 1 MiB, in ``store``."""
    fields = {"store": "rbd", "pool": ceph.POOL} if store == "rbd" else {}

    async def make(client: httpx.AsyncClient) -> None:
        body = {"name": "sda2", "size_bytes": 1 << 20, **fields}
        response = await client.post("/v1/devices", json=body)
        assert response.status_code == 201, response.text

    return make


@pytest.fixture
def backing(
    store: str, data_dir: Path, prefix: str, request: pytest.FixtureRequest
) -> Callable[[], bytes]:
    """What ``sda2`` holds, read outside the service: the file, or ``rbd export``."""
    if store == "rbd":
        cluster: ceph.Cluster = request.getfixturevalue("ceph_cluster")
        return lambda: cluster.export(f"{prefix}sda2")
    return (data_dir / "devices" / "sda2.img").read_bytes


@pytest.fixture
async def volume(client: httpx.AsyncClient, make_device: MakeDevice) -> None:
    await make_device(client)
    await make_volume(client)


async def put(
    client: httpx.AsyncClient, first: int, data: bytes, headers: dict[str, str] | None = None
) -> httpx.Response:
    headers = {"Content-Range": f"bytes {first}-{first + len(data) - 1}/*", **(headers or {})}
    return await client.put("/v1/volumes/vol/data", content=data, headers=headers)


def xts_sector(plain: bytes, sector: int) -> bytes:
    """Independent model: dm-crypt aes-xts-plain64, tweak = le64 sector number."""
    key = bytes.fromhex(XTS_KEY)
    tweak = sector.to_bytes(16, "little")
    encryptor = Cipher(algorithms.AES(key), modes.XTS(tweak)).encryptor()
    return encryptor.update(plain) + encryptor.finalize()


async def test_write_then_read_round_trips(client: httpx.AsyncClient, volume: None) -> None:
    data = os.urandom(8192)
    assert (await put(client, 4096, data)).status_code == 204
    response = await client.get("/v1/volumes/vol/data", headers={"Range": "bytes=4096-12287"})
    assert response.status_code == 206
    assert response.headers["content-range"] == f"bytes 4096-12287/{SIZE}"
    assert response.content == data


async def test_device_holds_dm_crypt_ciphertext(
    client: httpx.AsyncClient, volume: None, backing: Callable[[], bytes]
) -> None:
    data = os.urandom(1024)
    await put(client, 512 * 7, data)
    assert (await client.post("/v1/volumes/vol/flush")).status_code == 204
    raw = backing()
    assert raw[512 * 7 : 512 * 8] == xts_sector(data[:512], 7)
    assert raw[512 * 8 : 512 * 9] == xts_sector(data[512:], 8)


async def test_unaligned_write_preserves_neighbouring_bytes(
    client: httpx.AsyncClient, volume: None
) -> None:
    base = os.urandom(2048)
    await put(client, 0, base)
    await put(client, 100, b"x" * 700)
    expected = base[:100] + b"x" * 700 + base[800:]
    response = await client.get("/v1/volumes/vol/data", headers={"Range": "bytes=0-2047"})
    assert response.content == expected


@pytest.mark.parametrize(
    ("header", "first", "last"),
    [
        ("bytes=0-99", 0, 99),
        (f"bytes={SIZE - 10}-", SIZE - 10, SIZE - 1),
        ("bytes=-5", SIZE - 5, SIZE - 1),
    ],
)
async def test_range_forms(
    client: httpx.AsyncClient, volume: None, header: str, first: int, last: int
) -> None:
    response = await client.get("/v1/volumes/vol/data", headers={"Range": header})
    assert response.status_code == 206
    assert response.headers["content-range"] == f"bytes {first}-{last}/{SIZE}"
    assert len(response.content) == last - first + 1


async def test_range_outside_the_volume_is_416(client: httpx.AsyncClient, volume: None) -> None:
    response = await client.get("/v1/volumes/vol/data", headers={"Range": f"bytes={SIZE}-"})
    assert response.status_code == 416
    assert response.headers["content-range"] == f"bytes */{SIZE}"
    assert response.headers["content-type"] == "application/problem+json"


async def test_no_range_streams_the_whole_volume(client: httpx.AsyncClient, volume: None) -> None:
    response = await client.get("/v1/volumes/vol/data")
    assert response.status_code == 200
    assert response.headers["accept-ranges"] == "bytes"
    assert len(response.content) == SIZE


async def test_multiple_ranges_are_multipart_byteranges(
    client: httpx.AsyncClient, volume: None
) -> None:
    await put(client, 0, b"a" * 512)
    response = await client.get("/v1/volumes/vol/data", headers={"Range": "bytes=0-3,10-11"})
    assert response.status_code == 206
    assert response.headers["content-type"].startswith("multipart/byteranges; boundary=")
    assert f"Content-Range: bytes 0-3/{SIZE}".encode() in response.content
    assert b"aaaa" in response.content


async def test_etag_changes_on_write_and_if_none_match_gives_304(
    client: httpx.AsyncClient, volume: None
) -> None:
    first = await client.get("/v1/volumes/vol/data", headers={"Range": "bytes=0-0"})
    tag = first.headers["etag"]
    unchanged = await client.get("/v1/volumes/vol/data", headers={"If-None-Match": tag})
    assert unchanged.status_code == 304
    await put(client, 0, b"z" * 512)
    changed = await client.get("/v1/volumes/vol/data", headers={"If-None-Match": tag})
    assert changed.status_code == 200
    assert changed.headers["etag"] != tag


async def test_stale_if_match_on_write_is_412_and_writes_nothing(
    client: httpx.AsyncClient, volume: None
) -> None:
    before = await client.get("/v1/volumes/vol/data", headers={"Range": "bytes=0-511"})
    response = await put(client, 0, b"q" * 512, headers={"If-Match": '"stale"'})
    assert response.status_code == 412
    after = await client.get("/v1/volumes/vol/data", headers={"Range": "bytes=0-511"})
    assert after.content == before.content


async def test_a_repeated_header_counts_once_by_its_first_value(
    client: httpx.AsyncClient, volume: None
) -> None:
    """The first of repeated If-Match and Range headers applies, as Starlette's lookup does."""
    stale_first = [("If-Match", '"stale"'), ("If-Match", "*")]
    response = await client.put(
        "/v1/volumes/vol/data",
        content=b"q" * 512,
        headers=[("Content-Range", "bytes 0-511/*"), *stale_first],
    )
    assert response.status_code == 412
    ranges = [("Range", "bytes=0-9"), ("Range", "bytes=0-99")]
    response = await client.get("/v1/volumes/vol/data", headers=ranges)
    assert response.status_code == 206
    assert len(response.content) == 10


async def test_stale_if_range_returns_the_whole_volume(
    client: httpx.AsyncClient, volume: None
) -> None:
    response = await client.get(
        "/v1/volumes/vol/data", headers={"Range": "bytes=0-9", "If-Range": '"old"'}
    )
    assert response.status_code == 200
    assert len(response.content) == SIZE


async def test_put_without_content_range_is_400(client: httpx.AsyncClient, volume: None) -> None:
    response = await client.put("/v1/volumes/vol/data", content=b"x" * 512)
    assert response.status_code == 400


async def test_body_length_mismatch_is_400_and_writes_nothing(
    client: httpx.AsyncClient, volume: None
) -> None:
    before = await client.get("/v1/volumes/vol/data", headers={"Range": "bytes=0-511"})
    response = await client.put(
        "/v1/volumes/vol/data", content=b"w" * 100, headers={"Content-Range": "bytes 0-511/*"}
    )
    assert response.status_code == 400
    after = await client.get("/v1/volumes/vol/data", headers={"Range": "bytes=0-511"})
    assert after.content == before.content


async def test_write_beyond_the_volume_is_416(client: httpx.AsyncClient, volume: None) -> None:
    response = await put(client, SIZE - 100, b"x" * 200)
    assert response.status_code == 416


async def test_flush_is_acknowledged(client: httpx.AsyncClient, volume: None) -> None:
    assert (await client.post("/v1/volumes/vol/flush")).status_code == 204


async def test_discard_without_allow_discards_is_409(
    client: httpx.AsyncClient, volume: None
) -> None:
    response = await client.post("/v1/volumes/vol/discard", json={"offset": 0, "length": 4096})
    assert response.status_code == 409


async def test_discarded_sectors_read_as_decrypted_zeros(
    client: httpx.AsyncClient, make_device: MakeDevice
) -> None:
    await make_device(client)
    await make_volume(client, table=xts_table(extra=" 1 allow_discards"))
    await put(client, 0, os.urandom(4096))
    assert (
        await client.post("/v1/volumes/vol/discard", json={"offset": 0, "length": 4096})
    ).status_code == 204
    data = (await client.get("/v1/volumes/vol/data", headers={"Range": "bytes=0-511"})).content
    key = bytes.fromhex(XTS_KEY)
    decryptor = Cipher(algorithms.AES(key), modes.XTS(bytes(16))).decryptor()
    assert data == decryptor.update(bytes(512)) + decryptor.finalize()


async def test_write_zeroes_reads_back_zeros(client: httpx.AsyncClient, volume: None) -> None:
    await put(client, 0, os.urandom(4096))
    response = await client.post("/v1/volumes/vol/write-zeroes", json={"offset": 0, "length": 4096})
    assert response.status_code == 204
    data = await client.get("/v1/volumes/vol/data", headers={"Range": "bytes=0-4095"})
    assert data.content == bytes(4096)


async def test_zero_target_reads_zeros_and_drops_writes(client: httpx.AsyncClient) -> None:
    await make_volume(client, "z", table="0 64 zero")
    response = await client.put(
        "/v1/volumes/z/data", content=b"x" * 512, headers={"Content-Range": "bytes 0-511/*"}
    )
    assert response.status_code == 204
    data = await client.get("/v1/volumes/z/data", headers={"Range": "bytes=0-511"})
    assert data.content == bytes(512)


async def test_error_target_answers_an_io_error_problem(client: httpx.AsyncClient) -> None:
    await make_volume(client, "e", table="0 64 error")
    response = await client.get("/v1/volumes/e/data", headers={"Range": "bytes=0-511"})
    assert response.status_code == 500
    assert "error target" in response.json()["detail"]


async def test_suspended_volume_holds_io_then_answers_503(
    client: httpx.AsyncClient, volume: None
) -> None:
    await client.post("/v1/volumes/vol/suspend")
    response = await client.get("/v1/volumes/vol/data", headers={"Range": "bytes=0-511"})
    assert response.status_code == 503
    assert "retry-after" in response.headers


async def test_io_crosses_target_boundaries_and_stacked_volumes(
    client: httpx.AsyncClient, make_device: MakeDevice
) -> None:
    await make_device(client)
    table = f"0 1024 crypt aes-xts-plain64 {XTS_KEY} 0 sda2 0\n1024 1024 linear sda2 1024"
    await make_volume(client, "lower", table=table)
    await make_volume(client, "upper", table="0 2048 linear /dev/mapper/lower 0")
    data = os.urandom(8192)
    first = 1024 * 512 - 4096
    response = await client.put(
        "/v1/volumes/upper/data",
        content=data,
        headers={"Content-Range": f"bytes {first}-{first + 8191}/*"},
    )
    assert response.status_code == 204
    back = await client.get(
        "/v1/volumes/lower/data", headers={"Range": f"bytes={first}-{first + 8191}"}
    )
    assert back.content == data


async def test_head_gives_size_etag_and_range_without_a_body(
    client: httpx.AsyncClient, volume: None
) -> None:
    whole = await client.head("/v1/volumes/vol/data")
    assert whole.status_code == 200
    assert whole.headers["content-length"] == str(SIZE)
    assert whole.content == b""
    ranged = await client.head("/v1/volumes/vol/data", headers={"Range": "bytes=10-19"})
    assert ranged.status_code == 206
    assert ranged.headers["content-range"] == f"bytes 10-19/{SIZE}"
    assert ranged.headers["etag"] == whole.headers["etag"]


async def test_whole_volume_read_of_a_suspended_volume_is_a_503_problem_not_a_cut_stream(
    client: httpx.AsyncClient, volume: None
) -> None:
    await client.post("/v1/volumes/vol/suspend")
    response = await client.get("/v1/volumes/vol/data")
    assert response.status_code == 503
    assert response.headers["content-type"] == "application/problem+json"


async def test_chunked_put_without_content_length_is_411(
    client: httpx.AsyncClient, volume: None
) -> None:
    async def body():  # type: ignore[no-untyped-def]
        yield b"x" * 512

    response = await client.put(
        "/v1/volumes/vol/data", content=body(), headers={"Content-Range": "bytes 0-511/*"}
    )
    assert response.status_code == 411
    assert response.headers["content-type"] == "application/problem+json"


async def test_head_honours_if_none_match_like_get(client: httpx.AsyncClient, volume: None) -> None:
    tag = (await client.head("/v1/volumes/vol/data")).headers["etag"]
    response = await client.head("/v1/volumes/vol/data", headers={"If-None-Match": tag})
    assert response.status_code == 304
