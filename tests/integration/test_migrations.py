"""Migrations round-trip and match the models, on SQLite and on the real PostgreSQL."""

from pathlib import Path

import pytest
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
