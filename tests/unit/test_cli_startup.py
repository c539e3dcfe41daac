"""What ``reqcrypt serve`` says as it starts: every listener, where the secrets are, and
why it (or ``rotate-master-key``) refuses to, in one line."""

from __future__ import annotations

import gc
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import app.main
from app.cli import cli, startup_lines
from app.config import Settings
from app.keyfiles import MasterKeyError, data_dir_lock
from app.startup import OPEN_FILES_RESERVE, fit_open_files


def lines(tmp_path: Path, **fields: object) -> list[str]:
    settings = Settings(data_dir=tmp_path, **fields)  # type: ignore[arg-type]
    return startup_lines(settings, tmp_path / "admin.token")


def test_http_alone_names_its_url_the_token_file_and_the_key(tmp_path: Path) -> None:
    assert lines(tmp_path, port=8123) == [
        "HTTP on http://localhost:8123 (docs at http://localhost:8123/docs)",
        f"authenticate with 'Authorization: Bearer TOKEN'; the admin token is in "
        f"{tmp_path / 'admin.token'}",
        f"the master key is in {tmp_path / 'master.key'}",
    ]


def test_an_nbd_listener_is_listed_with_whether_it_has_tls(tmp_path: Path) -> None:
    plain = lines(tmp_path, port=8123, nbd_port=10809)
    assert plain[1] == "NBD on localhost:10809 (no TLS), exported volumes only"
    pem = tmp_path / "x.pem"
    pem.write_text("")
    secured = lines(
        tmp_path, port=8123, nbd_port=10809, nbd_tls_cert=pem, nbd_tls_key=pem, nbd_tls_ca=pem
    )
    assert secured[1] == (
        "NBD on localhost:10809 (TLS, client certificates required), exported volumes only"
    )


def test_an_io_token_from_the_environment_is_named(tmp_path: Path) -> None:
    shown = lines(tmp_path, io_token="i" * 32)
    assert "the io token (data path, read-only status) is in REQCRYPT_IO_TOKEN" in shown
    assert not any("i" * 32 in line for line in shown)


@pytest.mark.parametrize("command", ["serve", "rotate-master-key"])
def test_a_data_directory_in_use_is_one_error_line_naming_the_command(
    tmp_path: Path, command: str
) -> None:
    settings = Settings(data_dir=tmp_path)
    with data_dir_lock(settings, exclusive=True):
        result = CliRunner().invoke(
            cli, [command], env={"REQCRYPT_DATA_DIR": str(tmp_path)}, prog_name="reqcrypt"
        )
    assert result.exit_code == 1
    assert result.stderr == f"reqcrypt: {command}: {tmp_path} is in use by a running reqcrypt\n"


def test_a_data_directory_that_cannot_be_made_is_one_error_line(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    result = CliRunner().invoke(
        cli, ["serve"], env={"REQCRYPT_DATA_DIR": str(blocked / "data")}, prog_name="reqcrypt"
    )
    assert result.exit_code == 1
    assert result.stderr == f"reqcrypt: serve: {blocked / 'data'}: Not a directory\n"


def test_serve_starts_with_the_cyclic_collector_paused_and_leaves_it_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Imports and migrations run without cyclic collections; a refusal turns them back on."""
    seen: list[bool] = []

    def refuse(settings: Settings) -> None:
        seen.append(gc.isenabled())
        raise MasterKeyError("refused")

    monkeypatch.setattr(app.main, "check_master_key", refuse)
    result = CliRunner().invoke(
        cli, ["serve"], env={"REQCRYPT_DATA_DIR": str(tmp_path)}, prog_name="reqcrypt"
    )
    assert result.stderr == "reqcrypt: serve: refused\n"
    assert seen == [False]
    assert gc.isenabled()


def test_a_sqlite_service_never_loads_the_postgresql_driver(tmp_path: Path) -> None:
    """What serve imports, and its database check, leave psycopg out on SQLite."""
    check = (
        "import sys, app.cli, app.main; "
        f"app.main.checks.check_server('sqlite:///{tmp_path}/reqcrypt.db'); "
        "assert 'psycopg' not in sys.modules, 'psycopg imported'"
    )
    subprocess.run([sys.executable, "-c", check], check=True)


def test_connection_caps_past_the_hard_open_file_limit_refuse_to_serve(tmp_path: Path) -> None:
    reqcrypt = Path(sys.executable).with_name("reqcrypt")
    done = subprocess.run(
        ["sh", "-c", f"ulimit -n 512 && exec {reqcrypt} serve"],
        env={"PATH": "/usr/bin:/bin", "REQCRYPT_DATA_DIR": str(tmp_path / "data")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "reqcrypt: serve: the connection caps need 1152 open files (REQCRYPT_MAX_CONNECTIONS "
        "1024, REQCRYPT_NBD_MAX_CONNECTIONS when NBD is on, 128 more), the hard limit is 512: "
        "lower the caps or raise `ulimit -Hn`"
    ]


def test_serve_raises_its_soft_open_file_limit_to_what_the_caps_need(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    limits: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "getrlimit", lambda _: (256, 4096))
    monkeypatch.setattr(resource, "setrlimit", lambda _, pair: limits.append(pair))
    fit_open_files(Settings(data_dir=tmp_path, nbd_port=0))
    assert limits == [(1024 + 256 + OPEN_FILES_RESERVE, 4096)]
