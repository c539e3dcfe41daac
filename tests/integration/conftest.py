"""A real ``reqcrypt serve`` on a loopback port, for tests that need no special settings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_e2e_data import Server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    running = Server(tmp_path / "data")
    running.start()
    try:
        yield running
    finally:
        running.stop()
