"""Migrations round-trip and match the models, on SQLite and on the real PostgreSQL."""

import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from app.db import migrate

EXPECTED_TABLES = {
    "alembic_version",
    "benchmark_runs",
    "device_models",
    "devices",
    "engine_profiles",
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


def test_every_migration_file_ships_in_the_package() -> None:
    """An installed service (the image) has no source tree: migrations are package data."""
    root = Path(migrate.__file__).parent
    pyproject = tomllib.loads((root.parents[1] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["app.db"]
    files = [
        path.relative_to(root).as_posix()
        for path in (root / "migrations").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    ]
    assert any(name.startswith("migrations/versions/") for name in files)
    assert [name for name in files if not any(fnmatch(name, p) for p in patterns)] == []


def test_the_alembic_cli_and_the_service_use_the_same_migrations() -> None:
    ini = Path(migrate.__file__).parents[2] / "alembic.ini"
    cli = ScriptDirectory.from_config(Config(str(ini)))
    service = ScriptDirectory.from_config(migrate.alembic_config("sqlite://"))
    assert Path(cli.dir).resolve() == Path(service.dir).resolve()
    assert cli.get_heads() == service.get_heads()
