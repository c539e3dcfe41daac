"""Shared fixtures: settings, a migrated database, the app and an httpx client over ASGI."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from app.config import Settings
from tests.support import aes_paths, ceph
from tests.support.app import ADMIN_TOKEN, IO_TOKEN, asgi_client, make_settings, started
from tests.support.cluster import Node
from tests.support.database import (
    copy_database,
    fresh_postgres_database,
    migrated_postgres_template,
    migrated_template,
)
from tests.support.scheduling import DealtWorkStealing, slow_first

_aes_paths_run: set[str] = set()


def pytest_testnodedown(node: object, error: object) -> None:
    """An xdist worker is done: the AES paths it ran join the run's (tests/unit/conftest.py)."""
    output = getattr(node, "workeroutput", {})
    _aes_paths_run.update(output.get(aes_paths.WORKER_OUTPUT_KEY, ()))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    aes_paths.report(terminalreporter, _aes_paths_run)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    slow_first(items)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> DealtWorkStealing | None:
    """``--dist worksteal`` (scripts/test) deals the slow tests out first."""
    if config.getvalue("dist") == "worksteal":
        return DealtWorkStealing(config, log)
    return None


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's migrated SQLite database (each xdist worker has its own temp dir)."""
    return migrated_template(tmp_path_factory.mktemp("template"))


@pytest.fixture
def data_dir(tmp_path: Path, sqlite_template: Path) -> Path:
    """The test's data directory, holding its own copy of the migrated SQLite database:
    startup finds it at head instead of migrating an empty one."""
    path = tmp_path / "data"
    path.mkdir()
    copy_database(sqlite_template, path)
    return path


@pytest.fixture
def settings(data_dir: Path) -> Settings:
    return make_settings(data_dir)


@pytest.fixture
async def app(settings: Settings) -> AsyncIterator[FastAPI]:
    async with started(settings) as application:
        yield application


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


@pytest.fixture(scope="session")
def ceph_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ceph.Cluster]:
    """One throwaway Ceph cluster (mon + memstore OSD) for the whole session; no skip."""
    cluster = ceph.start(tmp_path_factory.mktemp("ceph"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def rbd_cluster(
    tmp_path: Path, postgres_url: str, ceph_cluster: ceph.Cluster
) -> Iterator[tuple[Callable[[str], Node], str]]:
    """``make("a")`` makes a node on the Ceph cluster (not started), and the image prefix
    of this test; every node is stopped and every image of the test removed afterwards."""
    prefix = f"c{uuid.uuid4().hex[:8]}-"
    nodes: list[Node] = []

    def make(node_id: str) -> Node:
        node = Node(tmp_path / "data", postgres_url, node_id)
        node.env["REQCRYPT_CEPH_CONF"] = str(ceph_cluster.conf)
        node.env["REQCRYPT_RBD_IMAGE_PREFIX"] = prefix
        nodes.append(node)
        return node

    yield make, prefix
    for node in nodes:
        if node.process is not None:
            node.process.send_signal(signal.SIGCONT)
            node.stop()
    for image in ceph_cluster.images():
        if image.startswith(prefix):
            ceph_cluster.run("rbd", "rm", f"{ceph.POOL}/{image}")


def skip_without_postgres() -> None:
    """There is no skip: the PostgreSQL tests must run (``.ci/run`` starts the server).
    REQCRYPT_SKIP_POSTGRES=1 deselects them knowingly."""
    if os.environ.get("REQCRYPT_SKIP_POSTGRES") == "1":
        pytest.skip("REQCRYPT_SKIP_POSTGRES=1")


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty database on the real PostgreSQL, dropped afterwards."""
    skip_without_postgres()
    with fresh_postgres_database() as url:
        yield url


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[str]:
    """The session's migrated PostgreSQL database (its name), copied by ``migrated_postgres_url``."""
    skip_without_postgres()
    with migrated_postgres_template() as name:
        yield name


@pytest.fixture
def migrated_postgres_url(postgres_template: str) -> Iterator[str]:
    """A fresh database on the real PostgreSQL already at head (a copy of the session's
    template), dropped afterwards."""
    with fresh_postgres_database(postgres_template) as url:
        yield url
