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
        client.post("/v1/devices", json={"name": "sdb1", "size_bytes": 1 << 20})
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


def vol(server: Server, *args: str) -> str:
    result = CliRunner().invoke(cli, ["vol", *args, "--url", server.base, "--token", ADMIN_TOKEN])
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


def test_create_reads_the_table_from_stdin_without_table(server: Server) -> None:
    dmsetup(server, "create", "piped", stdin=xts_table(sectors=512) + "\n")
    assert dmsetup(server, "table", "piped").startswith("0 512 crypt aes-xts-plain64")
    dmsetup(server, "remove", "piped")


def test_table_status_and_info_without_a_name_report_every_volume(server: Server) -> None:
    dmsetup(server, "create", "one", "--table", xts_table(sectors=1024))
    dmsetup(server, "create", "two", "--table", xts_table("sdb1", sectors=512))
    zeros = "0" * 128
    assert dmsetup(server, "table") == (
        f"one: 0 1024 crypt aes-xts-plain64 {zeros} 0 sda2 0\n"
        f"two: 0 512 crypt aes-xts-plain64 {zeros} 0 sdb1 0\n"
    )
    status = dmsetup(server, "status").splitlines()
    assert [line.split(": ")[0] for line in status] == ["one", "one", "two", "two"]
    assert status[0] == "one: 0 1024 crypt "
    info = dmsetup(server, "info").split("\n\n")
    assert [block.splitlines()[0] for block in info] == [
        "Name:              one",
        "Name:              two",
    ]
    dmsetup(server, "remove", "one")
    dmsetup(server, "remove", "two")


def test_without_volumes_the_listing_verbs_say_no_devices_found(server: Server) -> None:
    for verb in ("table", "status", "info", "ls"):
        assert dmsetup(server, verb) == "No devices found\n"


def test_errors_are_one_line_naming_the_request_and_the_detail(server: Server) -> None:
    result = CliRunner().invoke(
        cli, ["dmsetup", "info", "missing", "--url", server.base, "--token", ADMIN_TOKEN]
    )
    assert result.exit_code == 1
    assert result.output == "reqcrypt: GET /v1/volumes/missing: 404 volume missing not found\n"


def test_a_missing_argument_is_the_same_one_line_format(server: Server) -> None:
    result = CliRunner().invoke(cli, ["dmsetup", "create"])
    assert result.exit_code == 2
    assert result.output == (
        "reqcrypt: dmsetup create: Missing argument 'NAME'. (see reqcrypt dmsetup create --help)\n"
    )


def test_vol_set_changes_the_tuning_in_one_patch(server: Server) -> None:
    cbc = f"0 2048 crypt aes-cbc-plain64 {'11' * 32} 0 sda2 0"
    dmsetup(server, "create", "tuned", "--table", cbc)
    shown = vol(
        server,
        "set",
        "tuned",
        "dispatch_mode=bio",
        "elevator=mq-deadline",
        "plug_window_us=250",
        "max_read_size=128k",
        "nbd_export=on",
        "engine=mv-cesa",
    )
    assert shown.splitlines() == [
        "engine=mv-cesa",
        "dispatch_mode=bio",
        "elevator=mq-deadline",
        "plug_window_us=250",
        "max_read_size=131072",
        "max_write_size=none",
        "nbd_export=on",
    ]
    assert vol(server, "show", "tuned") == shown
    dmsetup(server, "remove", "tuned")


def test_vol_set_refuses_an_unknown_key_before_sending_anything(server: Server) -> None:
    result = CliRunner().invoke(
        cli, ["vol", "set", "any", "colour=blue", "--url", server.base, "--token", ADMIN_TOKEN]
    )
    assert result.exit_code == 2
    assert result.output.startswith(
        "reqcrypt: vol set: Invalid value: colour=blue: expected KEY=VALUE with KEY one of engine,"
    )


def test_vol_set_reports_the_services_refusal_and_changes_nothing(server: Server) -> None:
    dmsetup(server, "create", "kept", "--table", xts_table())
    result = CliRunner().invoke(
        cli,
        [
            "vol",
            "set",
            "kept",
            "dispatch_mode=bio",
            "engine=mv-cesa",
            "--url",
            server.base,
            "--token",
            ADMIN_TOKEN,
        ],
    )
    assert result.exit_code == 1
    assert result.output.startswith("reqcrypt: PATCH /v1/volumes/kept: 422 ")
    assert "dispatch_mode=request" in vol(server, "show", "kept")
    dmsetup(server, "remove", "kept")
