"""``reqcrypt bench http`` against a real uvicorn on a loopback port."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from app.cli import cli
from tests.support.app import ADMIN_TOKEN
from tests.support.servers import MIB, Server, make_volume

pytestmark = pytest.mark.e2e
BS = 64 << 10


def bench_http(server: Server, rw: str, *extra: str) -> str:
    result = CliRunner().invoke(
        cli,
        [
            "bench",
            "http",
            "--url",
            server.base,
            "--token",
            ADMIN_TOKEN,
            "--volume",
            "v",
            "--rw",
            rw,
            "--bs",
            "64k",
            "--size",
            "1M",
            "--iodepth",
            "2",
            *extra,
        ],
    )
    assert result.exit_code == 0, result.output
    return result.output


def test_the_http_runner_writes_and_reads_through_the_service(server: Server) -> None:
    with server.client() as client:
        make_volume(client, 4 * MIB)

        def read(first: int, length: int) -> bytes:
            response = client.get(
                "/v1/volumes/v/data", headers={"Range": f"bytes={first}-{first + length - 1}"}
            )
            assert response.status_code == 206
            return response.content

        region_before, next_block_before = read(0, MIB), read(MIB, BS)

        written = bench_http(server, "write")
        assert f"{MIB} bytes in 16 I/Os" in written
        assert "measured, client side over HTTP" in written

        # The runner writes one random payload to every block of the region.
        region = read(0, MIB)
        blocks = {region[first : first + BS] for first in range(0, MIB, BS)}
        assert len(blocks) == 1
        assert region != region_before
        assert read(MIB, BS) == next_block_before

        assert f"{MIB} bytes in 16 I/Os" in bench_http(server, "randread")


def test_iodepth_goes_to_the_service_as_batches(server: Server) -> None:
    with server.client() as client:
        make_volume(client, 4 * MIB)
        bench_http(server, "write")
        stats = client.get("/v1/volumes/v/status").json()["stats"]
    # 16 sequential 64 KiB writes in 8 batches of 2 adjacent ones: 8 merged requests.
    assert (stats["w_bios"], stats["w_ios"]) == (16, 8)


def test_no_batch_sends_one_request_per_io(server: Server) -> None:
    with server.client() as client:
        make_volume(client, 4 * MIB)
        assert f"{MIB} bytes in 16 I/Os" in bench_http(server, "randwrite", "--no-batch")
        assert client.get("/v1/volumes/v/status").json()["stats"]["w_bios"] == 16
