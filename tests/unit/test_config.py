"""Configuration errors read as one line per bad setting, and empty variables mean unset."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.config import Settings

REQCRYPT = str(Path(sys.executable).with_name("reqcrypt"))


def run(command: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REQCRYPT_")}
    return subprocess.run(
        [REQCRYPT, command],
        env={**clean, "REQCRYPT_DATA_DIR": str(tmp_path / "data"), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("command", ["serve", "migrate"])
def test_each_bad_setting_is_one_line_and_exit_code_2(command: str, tmp_path: Path) -> None:
    result = run(
        command,
        tmp_path,
        REQCRYPT_PORT="70000",
        REQCRYPT_ADMIN_TOKEN="shortQWX",
        REQCRYPT_MASTER_KEY="zzQWY",
        REQCRYPT_AUTH="maybe",
    )
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert sorted(line.split(":")[1].split("=")[0].strip() for line in lines) == [
        "REQCRYPT_ADMIN_TOKEN",
        "REQCRYPT_AUTH",
        "REQCRYPT_MASTER_KEY",
        "REQCRYPT_PORT",
    ]
    assert "REQCRYPT_PORT=70000: input should be less than or equal to 65535" in result.stderr
    assert "'enabled' or 'disabled'" in result.stderr
    assert "64 hex digits" in result.stderr
    assert "at least 16 characters" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert "QW" not in result.stderr
    assert not (tmp_path / "data").exists()


def test_a_rule_across_settings_is_one_line_too(tmp_path: Path) -> None:
    result = run("serve", tmp_path, REQCRYPT_AUTH="disabled", REQCRYPT_HOST="0.0.0.0")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "reqcrypt: REQCRYPT_AUTH=disabled is only allowed when bound to a loopback address,"
        " not '0.0.0.0'"
    ]


def test_empty_variables_mean_unset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("MASTER_KEY", "ADMIN_TOKEN", "IO_TOKEN", "DATABASE_URL", "PORT"):
        monkeypatch.setenv(f"REQCRYPT_{name}", "")
    settings = Settings(data_dir=tmp_path)
    assert settings.master_key is None
    assert settings.admin_token is None
    assert settings.io_token is None
    assert settings.database_url is None
    assert settings.port == 8000


def test_a_cluster_node_needs_postgresql(tmp_path: Path) -> None:
    result = run("serve", tmp_path, REQCRYPT_NODE_ID="node-a")
    assert result.returncode == 2
    assert "REQCRYPT_NODE_ID" in result.stderr
    assert "PostgreSQL" in result.stderr


def test_a_node_advertises_its_host_and_port_unless_told() -> None:
    url = "postgresql://db/reqcrypt"
    node = Settings(node_id="a", database_url=url, host="::1", port=8001)
    assert node.advertised_url == "http://[::1]:8001"
    assert (node.lease_seconds, node.renew_interval) == (2.0, pytest.approx(0.5))
    told = Settings(node_id="a", database_url=url, node_url="http://a.example:80/")
    assert told.advertised_url == "http://a.example:80"
    with pytest.raises(ValueError, match="LEASE_RENEW_SECONDS"):
        Settings(node_id="a", database_url=url, lease_seconds=2, lease_renew_seconds=3)


def test_each_part_reads_its_settings_through_a_typed_view() -> None:
    settings = Settings(max_volumes=3, plug_window_us=7, suspend_wait_seconds=0.5)
    assert settings.control.max_volumes == 3
    assert settings.control.plug_window_us == 7
    assert settings.control.suspend_wait_seconds == 0.5


def test_the_http_api_reads_its_limits_through_a_view() -> None:
    http: dict[str, float] = {"max_body_bytes": 4096, "max_ranges": 2, "max_volume_ios": 9}
    http |= {"body_timeout_seconds": 1.5, "head_timeout_seconds": 2.5}
    http |= {"suspend_wait_seconds": 0.5}
    assert Settings(**http).http.model_dump().items() >= http.items()


def test_only_a_cluster_node_has_cluster_settings() -> None:
    assert Settings().cluster is None
    node = Settings(
        node_id="a", database_url="postgresql://db/reqcrypt", lease_seconds=9, port=8001
    ).cluster
    assert node is not None
    assert (node.node_id, node.advertised_url, node.lease_seconds, node.renew_interval) == (
        "a",
        "http://127.0.0.1:8001",
        9,
        2.25,
    )


def test_only_an_nbd_listener_has_nbd_settings() -> None:
    assert Settings().nbd is None
    nbd = Settings(nbd_port=10809).nbd
    assert nbd is not None
    assert (nbd.host, nbd.nbd_port, nbd.nbd_tls_ca) == ("127.0.0.1", 10809, None)


@pytest.mark.parametrize("size", [6000, 2048, 1 << 31])
def test_a_split_size_that_is_not_whole_pages_up_to_a_gib_is_refused(size: int) -> None:
    with pytest.raises(ValueError, match="crypt_max_read_size"):
        Settings(crypt_max_read_size=size)


def test_the_split_sizes_are_unset_unless_given() -> None:
    settings = Settings(crypt_max_write_size=128 << 10)
    assert (settings.crypt_max_read_size, settings.crypt_max_write_size) == (None, 131072)
    assert settings.control.crypt_max_write_size == 131072
