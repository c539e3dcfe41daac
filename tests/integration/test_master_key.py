"""The master key: one per deployment, checked at start against the value the first node
recorded in SQL; rotation re-wraps every key at once and survives a crash at any step;
a wrong key stops the service before it serves anything."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

import app.db.records
import app.main
from app.cli import cli
from app.config import Settings
from app.db import keycheck, migrate
from app.db.records import master_key_unwraps
from app.db.session import make_engine, make_sessionmaker
from app.keyfiles import MasterKeyError, data_dir_lock, key_check_value, pending_master_key_path
from app.main import build_state, rotate_master_key
from tests.support.app import ADMIN_TOKEN, running
from tests.support.factories import xts_table
from tests.support.keys import CBC_KEY, XTS_KEY
from tests.support.servers import serve_refused

pytestmark = pytest.mark.anyio

PAYLOAD = os.urandom(8192)
ESSIV_TABLE = f"0 2048 crypt aes-cbc-essiv:sha256 {CBC_KEY} 0 pv 2048"


class Crash(BaseException):
    """A kill at this point: nothing after it runs, no ``except Exception`` catches it."""


@pytest.fixture
def key_settings(database_url: str, data_dir: Path) -> Settings:
    return Settings(
        data_dir=data_dir,
        database_url=database_url,
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
    )


async def populate(settings: Settings) -> None:
    """Three wrapped keys: two live tables and an inactive one."""
    async with running(settings) as client:
        await client.post("/v1/devices", json={"name": "pv", "size_bytes": 4 << 20})
        await client.post("/v1/volumes", json={"name": "xts", "table": xts_table("pv", 2048)})
        put = await client.put(
            "/v1/volumes/xts/data", content=PAYLOAD, headers={"Content-Range": "bytes 0-8191/*"}
        )
        assert put.status_code == 204
        await client.post("/v1/volumes", json={"name": "essiv", "table": ESSIV_TABLE})
        loaded = await client.put("/v1/volumes/essiv/table", json={"table": ESSIV_TABLE})
        assert loaded.status_code == 204, loaded.text


async def assert_intact(settings: Settings) -> None:
    """The service starts, every key unwraps to its value, and data reads back."""
    async with running(settings) as client:
        xts = await client.get("/v1/volumes/xts/table", params={"show_keys": "true"})
        assert XTS_KEY in xts.text
        for inactive in ("false", "true"):
            essiv = await client.get(
                "/v1/volumes/essiv/table", params={"show_keys": "true", "inactive": inactive}
            )
            assert CBC_KEY in essiv.text
        data = await client.get("/v1/volumes/xts/data", headers={"Range": "bytes=0-8191"})
        assert data.content == PAYLOAD


def unwraps(settings: Settings, key: bytes) -> bool | None:
    engine = make_engine(settings.resolved_database_url)
    try:
        return master_key_unwraps(make_sessionmaker(engine), key)
    finally:
        engine.dispose()


def recorded(settings: Settings) -> bytes | None:
    engine = make_engine(settings.resolved_database_url)
    try:
        return keycheck.recorded(make_sessionmaker(engine))
    finally:
        engine.dispose()


def key_file(settings: Settings) -> bytes:
    return bytes.fromhex(settings.resolved_master_key_file.read_text())


async def test_rotation_rewraps_every_key_under_a_new_master_key(key_settings: Settings) -> None:
    await populate(key_settings)
    old = key_file(key_settings)

    assert rotate_master_key(key_settings) == 3

    new = key_file(key_settings)
    assert new != old
    assert unwraps(key_settings, new) is True
    assert unwraps(key_settings, old) is False
    assert recorded(key_settings) == key_check_value(new)
    assert not pending_master_key_path(key_settings).exists()
    assert key_settings.resolved_master_key_file.stat().st_mode & 0o777 == 0o600
    await assert_intact(key_settings)


async def test_a_crash_before_the_transaction_keeps_the_old_key(
    key_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    await populate(key_settings)
    old = key_file(key_settings)

    def killed(*_: object) -> int:
        raise Crash

    monkeypatch.setattr(app.main, "rewrap_keys", killed)
    with pytest.raises(Crash):
        rotate_master_key(key_settings)
    monkeypatch.undo()
    assert pending_master_key_path(key_settings).exists()

    await assert_intact(key_settings)
    assert key_file(key_settings) == old
    assert not pending_master_key_path(key_settings).exists()
    assert unwraps(key_settings, old) is True


async def test_a_crash_inside_the_transaction_leaves_every_key_under_the_old_master_key(
    key_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    await populate(key_settings)
    old = key_file(key_settings)
    real_wrap = app.db.records.wrap_key
    calls = []

    def wrap_then_die(*args: object) -> bytes:
        calls.append(args)
        if len(calls) == 2:  # one row already re-wrapped in this transaction
            raise Crash
        return real_wrap(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(app.db.records, "wrap_key", wrap_then_die)
    with pytest.raises(Crash):
        rotate_master_key(key_settings)
    monkeypatch.undo()

    assert unwraps(key_settings, old) is True
    assert recorded(key_settings) == key_check_value(old)
    await assert_intact(key_settings)
    assert key_file(key_settings) == old
    assert not pending_master_key_path(key_settings).exists()


async def test_a_crash_after_the_commit_finishes_the_rotation_at_the_next_start(
    key_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    await populate(key_settings)
    old = key_file(key_settings)

    def killed(*_: object) -> None:
        raise Crash

    monkeypatch.setattr(app.main, "commit_pending_master_key", killed)
    with pytest.raises(Crash):
        rotate_master_key(key_settings)
    monkeypatch.undo()
    new = bytes.fromhex(pending_master_key_path(key_settings).read_text())
    assert key_file(key_settings) == old
    assert unwraps(key_settings, new) is True
    assert unwraps(key_settings, old) is False

    await assert_intact(key_settings)
    assert key_file(key_settings) == new
    assert not pending_master_key_path(key_settings).exists()


async def test_rotation_after_a_cut_short_rotation_starts_from_the_key_in_use(
    key_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    await populate(key_settings)

    def killed(*_: object) -> None:
        raise Crash

    monkeypatch.setattr(app.main, "commit_pending_master_key", killed)
    with pytest.raises(Crash):
        rotate_master_key(key_settings)
    monkeypatch.undo()

    assert rotate_master_key(key_settings) == 3
    await assert_intact(key_settings)


def test_rotation_is_refused_while_the_service_holds_the_data_directory(
    key_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REQCRYPT_DATA_DIR", str(key_settings.data_dir))
    monkeypatch.setenv("REQCRYPT_DATABASE_URL", key_settings.resolved_database_url)
    with data_dir_lock(key_settings, exclusive=False):
        result = CliRunner().invoke(cli, ["rotate-master-key"])
    assert result.exit_code == 1
    assert "in use by a running reqcrypt" in result.output
    assert not pending_master_key_path(key_settings).exists()


def test_rotation_of_a_key_from_the_environment_is_refused(
    key_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REQCRYPT_DATA_DIR", str(key_settings.data_dir))
    monkeypatch.setenv("REQCRYPT_DATABASE_URL", key_settings.resolved_database_url)
    monkeypatch.setenv("REQCRYPT_MASTER_KEY", "11" * 32)
    result = CliRunner().invoke(cli, ["rotate-master-key"])
    assert result.exit_code == 1
    assert "REQCRYPT_MASTER_KEY" in result.output


async def test_the_cli_rotates_and_reports_how_many_keys(
    key_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    await populate(key_settings)
    old = key_file(key_settings)
    monkeypatch.setenv("REQCRYPT_DATA_DIR", str(key_settings.data_dir))
    monkeypatch.setenv("REQCRYPT_DATABASE_URL", key_settings.resolved_database_url)
    result = CliRunner().invoke(cli, ["rotate-master-key"])
    assert result.exit_code == 0, result.output
    assert "re-wrapped 3 keys" in result.output
    assert key_file(key_settings) != old
    await assert_intact(key_settings)


def replace_key_file(settings: Settings, key_hex: str) -> Path:
    path = settings.resolved_master_key_file
    path.unlink(missing_ok=True)
    path.write_text(key_hex)
    path.chmod(0o600)
    return path


async def test_a_wrong_master_key_stops_the_start(key_settings: Settings) -> None:
    await populate(key_settings)
    path = replace_key_file(key_settings, "22" * 32)
    with pytest.raises(MasterKeyError, match=f"master key in {path} is not the one recorded"):
        build_state(key_settings, CollectorRegistry())


async def test_the_first_start_records_a_check_value_of_the_key_never_the_key(
    key_settings: Settings,
) -> None:
    async with running(key_settings):
        pass
    key = key_file(key_settings)
    value = recorded(key_settings)
    assert value == key_check_value(key)
    assert value is not None
    assert key not in value


@pytest.fixture
def node_b(key_settings: Settings, tmp_path: Path) -> Settings:
    """Another node's settings: the same database and devices, its own master key file."""
    (tmp_path / "node-b").mkdir()
    return key_settings.model_copy(update={"master_key_file": tmp_path / "node-b" / "master.key"})


async def test_a_second_node_with_another_generated_key_refuses_to_start(
    key_settings: Settings, node_b: Settings
) -> None:
    await populate(key_settings)
    path = replace_key_file(node_b, os.urandom(32).hex())
    with pytest.raises(MasterKeyError, match=f"master key in {path} is not the one recorded"):
        build_state(node_b, CollectorRegistry())
    await assert_intact(key_settings)


async def test_a_node_without_a_key_on_a_database_with_one_generates_none(
    key_settings: Settings, node_b: Settings
) -> None:
    await populate(key_settings)
    path = node_b.resolved_master_key_file
    with pytest.raises(MasterKeyError, match=f"{path} does not exist and the database has"):
        build_state(node_b, CollectorRegistry())
    assert not path.exists()


async def test_a_second_node_given_the_clusters_key_starts(
    key_settings: Settings, node_b: Settings
) -> None:
    await populate(key_settings)
    shutil.copy2(key_settings.resolved_master_key_file, node_b.resolved_master_key_file)
    await assert_intact(node_b)


async def test_rotation_with_the_nodes_stopped_needs_the_new_key_on_every_node(
    key_settings: Settings, node_b: Settings
) -> None:
    await populate(key_settings)
    shutil.copy2(key_settings.resolved_master_key_file, node_b.resolved_master_key_file)
    await assert_intact(node_b)  # both nodes stopped from here

    assert rotate_master_key(key_settings) == 3

    with pytest.raises(MasterKeyError, match="is not the one recorded"):
        build_state(node_b, CollectorRegistry())
    node_b.resolved_master_key_file.unlink()
    shutil.copy2(key_settings.resolved_master_key_file, node_b.resolved_master_key_file)
    await assert_intact(node_b)
    await assert_intact(key_settings)


async def test_a_database_from_before_the_check_value_gets_one_at_its_first_start(
    key_settings: Settings,
) -> None:
    await populate(key_settings)
    migrate.downgrade(key_settings.resolved_database_url, "8d3f2a61c5e4")  # before the table

    await assert_intact(key_settings)  # starting migrates, checks the stored keys, records
    assert recorded(key_settings) == key_check_value(key_file(key_settings))


async def test_a_wrong_key_on_a_database_from_before_the_check_value_is_refused(
    key_settings: Settings,
) -> None:
    await populate(key_settings)
    migrate.downgrade(key_settings.resolved_database_url, "8d3f2a61c5e4")
    path = replace_key_file(key_settings, "44" * 32)
    with pytest.raises(MasterKeyError, match=f"master key in {path} does not unwrap"):
        build_state(key_settings, CollectorRegistry())
    assert recorded(key_settings) is None


def test_the_first_check_value_recorded_stays(key_settings: Settings) -> None:
    migrate.upgrade(key_settings.resolved_database_url)
    engine = make_engine(key_settings.resolved_database_url)
    try:
        sessions = make_sessionmaker(engine)
        assert keycheck.record(sessions, b"a" * 32) == b"a" * 32
        assert keycheck.record(sessions, b"b" * 32) == b"a" * 32  # a later first start lost
    finally:
        engine.dispose()


def test_serve_with_a_wrong_master_key_exits_with_one_line_and_binds_nothing(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    settings = Settings(data_dir=data_dir, admin_token=ADMIN_TOKEN)  # type: ignore[arg-type]

    import anyio

    anyio.run(populate, settings)
    path = replace_key_file(settings, "33" * 32)
    assert serve_refused(data_dir) == [
        f"reqcrypt: serve: the master key in {path} is not the one recorded in the database: "
        "supply the cluster's master key"
    ]


KILLED_ROTATION = textwrap.dedent(
    """
    import os, signal, sys
    import app.main, app.db.records

    def die(*_):
        os.kill(os.getpid(), signal.SIGKILL)

    point = sys.argv[1]
    if point == "before-transaction":
        app.main.rewrap_keys = die
    elif point == "inside-transaction":
        real_wrap, calls = app.db.records.wrap_key, []

        def wrap(*args):
            calls.append(args)
            if len(calls) == 2:
                die()
            return real_wrap(*args)

        app.db.records.wrap_key = wrap
    elif point == "after-commit":
        app.main.commit_pending_master_key = die
    sys.argv = ["reqcrypt", "rotate-master-key"]
    from app.cli import main
    main()
    """
)


@pytest.mark.parametrize(
    ("point", "survivor"),
    [("before-transaction", "old"), ("inside-transaction", "old"), ("after-commit", "new")],
)
async def test_a_sigkilled_rotation_leaves_one_master_key_that_unwraps_everything(
    key_settings: Settings, point: str, survivor: str
) -> None:
    await populate(key_settings)
    old = key_file(key_settings)
    env = {
        **os.environ,
        "REQCRYPT_DATA_DIR": str(key_settings.data_dir),
        "REQCRYPT_DATABASE_URL": key_settings.resolved_database_url,
    }
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_ROTATION, point], env=env, capture_output=True, timeout=60
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    pending = pending_master_key_path(key_settings)
    assert pending.exists()
    new = bytes.fromhex(pending.read_text())
    assert unwraps(key_settings, old if survivor == "old" else new) is True
    assert unwraps(key_settings, new if survivor == "old" else old) is False

    await assert_intact(key_settings)
    assert key_file(key_settings) == (old if survivor == "old" else new)
    assert not pending.exists()


async def test_serve_of_a_second_node_with_its_own_data_directory_exits_with_one_line(
    key_settings: Settings, tmp_path: Path
) -> None:
    await populate(key_settings)
    data_dir = tmp_path / "node-b-data"
    assert serve_refused(data_dir, key_settings.resolved_database_url) == [
        f"reqcrypt: serve: {data_dir / 'master.key'} does not exist and the database has a master key "
        "recorded: supply the cluster's master key (that file or REQCRYPT_MASTER_KEY)"
    ]
    assert not (data_dir / "master.key").exists()
