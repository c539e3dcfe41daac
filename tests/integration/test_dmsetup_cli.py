"""``reqcrypt dmsetup`` drives a real service the way dmsetup drives the kernel."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from typer.testing import CliRunner

from app.cli import cli
from tests.support.app import ADMIN_TOKEN
from tests.support.factories import xts_table
from tests.support.keys import XTS_KEY
from tests.support.servers import HEADERS, Server

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("dm") / "data")
    running.start()
    with httpx.Client(base_url=running.base, headers=HEADERS) as client:
        client.post("/v1/devices", json={"name": "sda2", "size_bytes": 1 << 20})
    try:
        yield running
    finally:
        running.stop()


def dmsetup(server: Server, *args: str, stdin: str | None = None) -> str:
    result = CliRunner().invoke(
        cli,
        ["dmsetup", *args, "--url", server.base, "--token", ADMIN_TOKEN],
        input=stdin,
    )
    assert result.exit_code == 0, result.output
    return result.output


def test_create_table_info_and_remove(server: Server) -> None:
    dmsetup(server, "create", "vol", "--table", xts_table())
    assert dmsetup(server, "table", "vol") == f"0 2048 crypt aes-xts-plain64 {'0' * 128} 0 sda2 0\n"
    shown = dmsetup(server, "table", "vol", "--showkeys")
    assert XTS_KEY in shown
    info = dmsetup(server, "info", "vol")
    assert "State:             ACTIVE" in info
    assert "Tables present:    LIVE" in info
    assert "vol\t(2048 sectors, active)" in dmsetup(server, "ls")
    dmsetup(server, "remove", "vol")
    assert dmsetup(server, "ls") == "No devices found\n"


def test_load_from_stdin_suspend_message_resume(server: Server) -> None:
    dmsetup(server, "create", "k", "--table", xts_table())
    dmsetup(server, "load", "k", "--table-file", "-", stdin=xts_table(sectors=1024))
    assert "LIVE & INACTIVE" in dmsetup(server, "info", "k")
    dmsetup(server, "suspend", "k")
    dmsetup(server, "message", "k", "0", "key", "wipe")
    dmsetup(server, "message", "k", "0", "key", "set", XTS_KEY)
    dmsetup(server, "resume", "k")
    assert dmsetup(server, "table", "k").startswith("0 1024 crypt")
    assert dmsetup(server, "status", "k").startswith("0 1024 crypt \n")
    dmsetup(server, "remove", "k")


def test_errors_print_the_detail_and_exit_1(server: Server) -> None:
    result = CliRunner().invoke(
        cli, ["dmsetup", "info", "missing", "--url", server.base, "--token", ADMIN_TOKEN]
    )
    assert result.exit_code == 1
    assert "volume missing not found" in result.output
