"""/docs renders in a real browser with the network blocked: its assets ship with the service."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.servers import Server

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("docs") / "data")
    running.start()
    try:
        yield running
    finally:
        running.stop()


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "chromium is missing: scripts/setup --test installs Debian's chromium"
    return found


def rendered_dom(url: str, profile: Path) -> str:
    """The page's DOM after its scripts ran, with every non-loopback request refused."""
    result = subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            # Loopback bypasses the proxy; everything else goes to a closed port and fails.
            "--proxy-server=127.0.0.1:9",
            "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
            "--virtual-time-budget=15000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return result.stdout


def test_the_docs_page_names_no_external_url(server: Server) -> None:
    for page in ("/docs", "/redoc"):
        html = httpx.get(server.base + page).text
        assert not re.search(r"(https?:)?//[a-z]", html), html


def test_the_docs_page_renders_every_operation_offline(server: Server, tmp_path: Path) -> None:
    dom = rendered_dom(f"{server.base}/docs", tmp_path / "profile")
    rendered = set(re.findall(r'data-path="([^"]+)"', dom))
    document = httpx.get(f"{server.base}/openapi.json").json()
    assert rendered == set(document["paths"])
    assert 'class="opblock-summary-description"' in dom


def test_redoc_renders_offline(server: Server, tmp_path: Path) -> None:
    dom = rendered_dom(f"{server.base}/redoc", tmp_path / "profile")
    assert "/v1/volumes/{name}/data" in dom
