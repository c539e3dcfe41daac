"""Shared integration fixtures: a real ``reqcrypt serve`` on a loopback port, and an app
run in process against SQLite or the real PostgreSQL, for tests that restart it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from app.config import Settings
from app.main import create_app
from tests.conftest import ADMIN_TOKEN, asgi_client
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


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'reqcrypt.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url
