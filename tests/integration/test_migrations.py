"""Migrations round-trip and match the models, on SQLite and on the real PostgreSQL."""

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from app.db import migrate
from tests.support.build import BUILD_INPUTS

ROOT = Path(__file__).resolve().parents[2]
EXPECTED_TABLES = {
    "alembic_version",
    "benchmark_runs",
    "device_models",
    "devices",
    "engine_profiles",
    "master_key_check",
    "nodes",
    "volume_tables",
    "volumes",
    "wrapped_keys",
}


def table_names(url: str) -> set[str]:
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def round_trip(url: str) -> None:
    migrate.upgrade(url)
    assert table_names(url) == EXPECTED_TABLES
    migrate.downgrade(url, "base")
    assert table_names(url) == {"alembic_version"}
    migrate.upgrade(url)
    assert table_names(url) == EXPECTED_TABLES
    migrate.check(url)


def test_sqlite_upgrade_downgrade_upgrade_and_no_drift(tmp_path: Path) -> None:
    round_trip(f"sqlite:///{tmp_path / 'm.db'}")


@pytest.mark.postgres
def test_postgres_upgrade_downgrade_upgrade_and_no_drift(postgres_url: str) -> None:
    round_trip(postgres_url)


FAILING_REVISION = """
import sqlalchemy as sa
from alembic import op

revision = "f00000000bad"
down_revision = "{head}"
branch_labels = None
depends_on = None


def upgrade():
    op.create_table("half_done", sa.Column("id", sa.Integer, primary_key=True))
    raise RuntimeError("this revision fails mid-way")


def downgrade():
    pass
"""


def test_a_sqlite_upgrade_that_fails_mid_way_leaves_the_database_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every revision runs in one SQLite transaction (one commit, not one per statement):
    a failure in the last revision undoes the tables of all the earlier ones."""
    scripts = tmp_path / "migrations"
    shutil.copytree(ROOT / "migrations", scripts, ignore=shutil.ignore_patterns("__pycache__"))
    head = ScriptDirectory.from_config(migrate.alembic_config("sqlite://")).get_current_head()
    (scripts / "versions" / "9999_fails.py").write_text(FAILING_REVISION.format(head=head))
    monkeypatch.setattr(migrate, "MIGRATIONS", scripts)
    url = f"sqlite:///{tmp_path / 'm.db'}"
    with pytest.raises(RuntimeError, match="fails mid-way"):
        migrate.upgrade(url)
    assert table_names(url) == set()
    migrate.upgrade(url, head)
    assert table_names(url) == EXPECTED_TABLES


def test_the_script_directory_is_the_top_level_migrations() -> None:
    service = ScriptDirectory.from_config(migrate.alembic_config("sqlite://"))
    assert Path(service.dir).resolve() == ROOT / "migrations"
    assert (ROOT / "migrations" / "alembic.ini").is_file()
    assert not (ROOT / "app" / "db" / "migrations").exists()


def test_the_alembic_cli_and_the_service_use_the_same_migrations() -> None:
    cli = ScriptDirectory.from_config(Config(str(ROOT / "migrations" / "alembic.ini")))
    service = ScriptDirectory.from_config(migrate.alembic_config("sqlite://"))
    assert Path(cli.dir).resolve() == Path(service.dir).resolve()
    assert cli.get_heads() == service.get_heads()


def test_the_alembic_command_line_migrates_from_the_source_tree(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    alembic = Path(sys.executable).with_name("alembic")
    subprocess.run(
        [str(alembic), "-c", str(ROOT / "migrations" / "alembic.ini"), "upgrade", "head"],
        env={**os.environ, "REQCRYPT_DATABASE_URL": url},
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    assert table_names(url) == EXPECTED_TABLES


@pytest.mark.slow
@pytest.mark.e2e
def test_an_installed_wheel_migrates_without_the_source_tree(tmp_path: Path) -> None:
    """The image installs the wheel only: its `reqcrypt migrate` must find the migrations."""
    source = tmp_path / "src"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.so")
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        else:
            shutil.copy(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "-qq"]
    quiet = {**os.environ, "PYTHONWARNINGS": "ignore"}
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(source)],
        check=True,
        env=quiet,
    )
    (wheel,) = tmp_path.glob("reqcrypt-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    shipped = sorted(n for n in names if n.startswith("app/migrations/versions/"))
    expected = sorted(
        f"app/migrations/versions/{p.name}" for p in (ROOT / "migrations" / "versions").glob("*.py")
    )
    assert shipped == expected
    assert "app/migrations/env.py" in names
    assert "app/migrations/script.py.mako" in names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python*/site-packages")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True)
    # The dependencies come from the test environment; its editable reqcrypt does not
    # (a plain path entry: the editable install's .pth hook is not run).
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    url = f"sqlite:///{tmp_path / 'wheel.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("REQCRYPT_")}
    env.update(REQCRYPT_DATABASE_URL=url, REQCRYPT_DATA_DIR=str(tmp_path / "data"))
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import app.db.migrate as m; print(m.MIGRATIONS)"],
        env=env,
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
    )
    assert where.stdout.strip() == str(site / "app" / "migrations")
    migrated = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "from app.cli import main; main()", "migrate"],
        env=env,
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
    )
    assert "database at head" in migrated.stdout
    assert table_names(url) == EXPECTED_TABLES


@pytest.mark.anyio
async def test_downgrading_past_every_column_keeps_every_volumes_tables_and_keys(
    tmp_path: Path,
) -> None:
    """SQLite's batch copy would drop and recreate a parent table, and with foreign keys
    on that cascades into its children: downgrades drop columns in place instead."""
    from app.config import Settings
    from tests.support.app import ADMIN_TOKEN, running
    from tests.support.factories import xts_table

    settings = Settings(
        data_dir=tmp_path / "data",
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
    )
    url = settings.resolved_database_url
    async with running(settings) as client:
        await client.post("/v1/devices", json={"name": "pv", "size_bytes": 1 << 20})
        created = await client.post(
            "/v1/volumes", json={"name": "kept", "table": xts_table("pv", 2048)}
        )
        assert created.status_code == 201, created.text

    def rows() -> dict[str, int]:
        engine = create_engine(url)
        try:
            with engine.connect() as connection:
                return {
                    name: connection.exec_driver_sql(f"SELECT count(*) FROM {name}").scalar_one()
                    for name in ("devices", "volumes", "volume_tables", "wrapped_keys")
                }
        finally:
            engine.dispose()

    before = rows()
    assert before == {"devices": 1, "volumes": 1, "volume_tables": 1, "wrapped_keys": 1}
    migrate.downgrade(url, "79d55020ccb7")  # before the first column added to volumes
    assert rows() == before
    migrate.upgrade(url)
    assert rows() == before


def test_every_batch_alteration_alters_in_place() -> None:
    """SQLite's batch copy drops and recreates the table; with foreign keys on, that
    cascades into every child row (a volume's tables and keys). SQLite >= 3.35 adds and
    drops columns in place: every migration must ask for that."""
    copying = [
        f"{path.name}:{number}"
        for path in sorted((ROOT / "migrations" / "versions").glob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "batch_alter_table(" in line and 'recreate="never"' not in line
    ]
    assert not copying
