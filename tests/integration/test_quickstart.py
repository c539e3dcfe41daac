"""docs/quickstart.md's commands, run as written against a real service."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.ports import free_port, wait_ready

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def blocks() -> list[str]:
    text = (ROOT / "docs" / "quickstart.md").read_text()
    return re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL)


def test_the_quickstart_starts_with_scripts_run_then_four_commands() -> None:
    first, cli = blocks()[:2]
    assert first.strip() == "scripts/run"
    assert len(cli.strip().splitlines()) == 4


def test_the_quickstart_cli_and_curl_blocks_write_and_read_back(tmp_path: Path) -> None:
    """As a new user: HOME is fresh, the service was started as scripts/run starts it."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REQCRYPT_", "XDG_"))}
    env.update(HOME=str(tmp_path), REQCRYPT_PORT=str(port), REQCRYPT_LOG_LEVEL="warning")
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("reqcrypt")), "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}/readyz", server)
        _, cli, _, curl = blocks()
        for block, expected in ((cli, "hello, disk!\n"), (curl, "hello, disk!")):
            script = block.replace("localhost:8000", f"localhost:{port}").replace(
                ".venv/bin/reqcrypt", str(Path(sys.executable).with_name("reqcrypt"))
            )
            result = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", script],
                env={**env, "REQCRYPT_URL": f"http://127.0.0.1:{port}"},  # port 8000 may be taken
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert result.returncode == 0, result.stderr
            assert result.stdout.endswith(expected), result.stdout
    finally:
        server.terminate()
        server.wait(timeout=15)
