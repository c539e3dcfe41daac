"""``reqcrypt bench soak``: 64 clients for 10 s against a real uvicorn, nothing lost."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from app.bench.soak import check_loopback
from app.cli import cli
from app.errors import InvalidInput
from tests.support.app import ADMIN_TOKEN
from tests.support.servers import Server

pytestmark = pytest.mark.e2e


@pytest.mark.slow
def test_a_ten_second_soak_loses_nothing_and_keeps_memory_bounded(server: Server) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "bench", "soak", "--url", server.base, "--token", ADMIN_TOKEN,
            "--clients", "64", "--duration", "10", "--volumes", "3", "--size", "4M",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "FAILED" not in result.output
    assert "blocks verified" in result.output
    counts = dict(line.split()[:2] for line in result.output.splitlines() if line.startswith("  "))
    for op in ("write", "write-partial", "write-batch", "read", "read-ranges", "suspend"):
        assert int(counts[op]) > 0, op
    with server.client() as client:
        assert not [v for v in client.get("/v1/volumes").json() if v["name"].startswith("soak-")]


@pytest.mark.parametrize("url", ["http://10.0.0.1:8000", "http://example.com"])
def test_the_soak_refuses_anything_but_loopback(url: str) -> None:
    with pytest.raises(InvalidInput, match="loopback"):
        check_loopback(url)


def test_metrics_export_the_process_resident_memory(server: Server) -> None:
    with server.client() as client:
        assert "process_resident_memory_bytes" in client.get("/metrics").text
