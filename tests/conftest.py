"""Shared fixtures: settings, a migrated database, the app and an httpx client over ASGI."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import httpx
import psycopg
import pytest
from fastapi import FastAPI

from app.config import Settings
from app.main import create_app
from tests.support import ceph

ADMIN_TOKEN = "admin-token-for-tests-0123456789"
IO_TOKEN = "io-token-for-tests-0123456789abc"
POSTGRES_ADMIN_DSN = os.environ.get(
    "REQCRYPT_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    return path


@pytest.fixture
def settings(data_dir: Path) -> Settings:
    return Settings(
        data_dir=data_dir,
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
        io_token=IO_TOKEN,  # type: ignore[arg-type]
        suspend_wait_seconds=2.0,
    )


@pytest.fixture
async def app(settings: Settings) -> AsyncIterator[FastAPI]:
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        yield application


@asynccontextmanager
async def asgi_client(app: FastAPI, token: str | None) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client calling ``app`` in process, with ``token`` as bearer if given."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://testserver", headers=headers
    ) as http:
        yield http


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(app, ADMIN_TOKEN) as http:
        yield http


@pytest.fixture
async def anon_client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(app, None) as http:
        yield http


@pytest.fixture
async def io_client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(app, IO_TOKEN) as http:
        yield http


@contextmanager
def fresh_postgres_database() -> Iterator[str]:
    """A new database on the real PostgreSQL, dropped afterwards (its URL)."""
    name = f"reqcrypt_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = POSTGRES_ADMIN_DSN.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def ceph_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ceph.Cluster]:
    """One throwaway Ceph cluster (mon + memstore OSD) for the whole session; no skip."""
    cluster = ceph.start(tmp_path_factory.mktemp("ceph"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh database on the real PostgreSQL, dropped afterwards.

    There is no skip: the PostgreSQL tests must run (``.ci/run`` starts the
    server). Set REQCRYPT_SKIP_POSTGRES=1 to deselect them knowingly.
    """
    if os.environ.get("REQCRYPT_SKIP_POSTGRES") == "1":
        pytest.skip("REQCRYPT_SKIP_POSTGRES=1")
    with fresh_postgres_database() as url:
        yield url
