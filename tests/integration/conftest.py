"""Shared integration fixtures: a real ``reqcrypt serve`` on a loopback port, and an app
run in process against SQLite or the real PostgreSQL, for tests that restart it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from app.config import Settings
from app.main import create_app
from tests.conftest import ADMIN_TOKEN, asgi_client
from tests.integration.test_deployment import free_port
from tests.integration.test_e2e_data import Server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    running = Server(tmp_path / "data")
    running.start()
    try:
        yield running
    finally:
        running.stop()


@asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its lifespan, called in process with the admin token."""
    application = create_app(settings)
    async with (
        application.router.lifespan_context(application),
        asgi_client(application, ADMIN_TOKEN) as client,
    ):
        yield client


def serve_refused(data_dir: Path, database_url: str | None = None) -> list[str]:
    """``reqcrypt serve`` expected to stop before it serves: its stderr lines (exit 1)."""
    env = {
        **os.environ,
        "REQCRYPT_DATA_DIR": str(data_dir),
        "REQCRYPT_ADMIN_TOKEN": ADMIN_TOKEN,
        "REQCRYPT_PORT": str(free_port()),
    }
    if database_url is not None:
        env["REQCRYPT_DATABASE_URL"] = database_url
    reqcrypt = str(Path(sys.executable).with_name("reqcrypt"))
    done = subprocess.run(
        [reqcrypt, "serve"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Uvicorn running" not in done.stdout + done.stderr
    return done.stderr.strip().splitlines()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'reqcrypt.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url
