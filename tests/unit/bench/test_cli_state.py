"""In-process benchmark commands never open a service's state unless asked, and a refusal
to start is one ``reqcrypt: bench <command>: …`` line."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from app.cli import cli
from app.config import Settings
from app.main import build_state

TEMPLATE = "0 2048 crypt aes-xts-plain64 " + "ab" * 64 + " 0 {dev} 0"


def _service(data_dir: Path) -> str:
    """A service's data directory whose database has a master key recorded; its URL."""
    url = f"sqlite:///{data_dir / 'service.db'}"
    state = build_state(
        Settings(data_dir=data_dir, database_url=url, auth="disabled"), CollectorRegistry()
    )
    state.benchmarks.close()
    state.control.close()
    state.db_engine.dispose()
    return url


def _benchmark_runs(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return connection.execute(sa.text("SELECT count(*) FROM benchmark_runs")).scalar_one()
    finally:
        engine.dispose()


def _bench_run(env: dict[str, str], *extra: str):
    return CliRunner().invoke(
        cli,
        [
            "bench", "run", "--volume-template", TEMPLATE, "--device-size", "1M",
            "--rw", "write", "--bs", "64k", "--size", "256k", "--rounds", "1", "--warmup", "0",
            "--json", *extra,
        ],
        env=env,
        prog_name="reqcrypt",
    )  # fmt: skip


def test_bench_run_in_a_services_environment_uses_a_database_of_its_own(tmp_path: Path) -> None:
    service_dir = tmp_path / "service"
    service_dir.mkdir()
    url = _service(service_dir)
    env = {
        "REQCRYPT_DATA_DIR": str(service_dir),
        "REQCRYPT_DATABASE_URL": url,
        "REQCRYPT_NODE_URL": "http://127.0.0.1:8000",
    }
    before = sorted(service_dir.rglob("*"))
    result = _bench_run(env)
    assert result.exit_code == 0, result.output
    assert _benchmark_runs(url) == 0
    assert sorted(service_dir.rglob("*")) == before


def test_bench_run_with_data_dir_opens_that_service_and_its_database(tmp_path: Path) -> None:
    service_dir = tmp_path / "service"
    service_dir.mkdir()
    url = _service(service_dir)
    result = _bench_run({"REQCRYPT_DATABASE_URL": url}, "--data-dir", str(service_dir))
    assert result.exit_code == 0, result.output
    assert _benchmark_runs(url) == 1


def test_a_service_database_whose_key_is_missing_is_one_error_line(tmp_path: Path) -> None:
    service_dir = tmp_path / "service"
    service_dir.mkdir()
    url = _service(service_dir)
    (service_dir / "master.key").unlink()
    result = _bench_run({"REQCRYPT_DATABASE_URL": url}, "--data-dir", str(service_dir))
    assert result.exit_code == 1
    assert result.stderr.startswith("reqcrypt: bench run: ")
    assert result.stderr.count("\n") == 1
    assert "master.key" in result.stderr


def test_a_trace_that_cannot_be_read_is_one_error_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing.blkparse"
    result = CliRunner().invoke(cli, ["bench", "replay", str(missing)], prog_name="reqcrypt")
    assert result.exit_code == 1
    assert result.stderr == f"reqcrypt: bench replay: {missing}: No such file or directory\n"
