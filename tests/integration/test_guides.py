"""The guides run as written: every ```sh block of README, quickstart, api and nbd, in order.

Each guide gets a fresh ``reqcrypt serve`` in a fresh HOME, started as
``scripts/run`` starts it (the admin token file under ``~/.local/share``), plus
an NBD listener and the HTTP ceiling, so every block can run. A guide's blocks
run in one bash (``set -euo pipefail``; variables carry from block to block) in
an empty working directory, with two rewrites only: the service's ports, and
``.venv/bin/reqcrypt`` for this checkout's. ``curl`` fails on an HTTP error
status, so an example that the service refuses fails the guide.

A block runs when its info string is ``sh``. A block that needs what a test
machine lacks says so in the info string's second word (``sh ceph``,
``sh cluster``, ``sh dev``), and the harness checks the word is one of those.
A line ``[VAR=value ...] scripts/run`` is the server this harness already runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.ports import free_port, wait_ready

ROOT = Path(__file__).resolve().parents[2]
GUIDES = ("README.md", "docs/quickstart.md", "docs/api.md", "docs/nbd.md")
#: Blocks the harness does not run, and why.
NOT_RUN = {
    "ceph": "needs a Ceph cluster (tests/support/ceph.py runs those against a throwaway one)",
    "cluster": "needs several nodes (tests/integration/test_cluster.py)",
    "dev": "developer commands: the test suite itself, benchmarks, a kernel under qemu",
}
BLOCK = re.compile(r"^```(sh[^\n]*)\n(.*?)^```", flags=re.DOTALL | re.MULTILINE)
SERVER_LINE = re.compile(r"^(?:REQCRYPT_[A-Z_]+=\S+ )*scripts/run$")
REQCRYPT = str(Path(sys.executable).with_name("reqcrypt"))
pytestmark = pytest.mark.e2e


def blocks(guide: str) -> list[tuple[str, str]]:
    """(info string, text) of each ```sh block, in order."""
    return [(info.strip(), text) for info, text in BLOCK.findall((ROOT / guide).read_text())]


def script(guide: str, port: int, nbd_port: int) -> str:
    lines = [
        'curl() { case " $* " in *" -f"* | *" --fail"*) command curl "$@" ;;',
        '  *) command curl --fail-with-body --no-progress-meter "$@" ;; esac; }',
    ]
    for info, text in blocks(guide):
        reason = info.removeprefix("sh").strip()
        if reason:
            assert reason in NOT_RUN, f"{guide}: ```{info}"
            continue
        lines.append(rewrite(text, port, nbd_port))
    return "\n".join(lines) + "\n"


def rewrite(text: str, port: int, nbd_port: int) -> str:
    """A block as run here: this harness's ports and reqcrypt; its scripts/run already runs."""
    lines = []
    for line in text.splitlines():
        if SERVER_LINE.match(line.strip()):
            continue
        line = line.replace("localhost:8000", f"localhost:{port}")
        line = line.replace("localhost:10809", f"localhost:{nbd_port}")
        lines.append(line.replace(".venv/bin/reqcrypt", REQCRYPT))
    return "\n".join(lines)


@pytest.fixture
def home(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str], int, int]]:
    """A fresh HOME with a service in it, as scripts/run leaves a new user's machine."""
    port, nbd_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REQCRYPT_", "XDG_"))}
    env.update(HOME=str(tmp_path), REQCRYPT_LOG_LEVEL="warning")
    served = {
        **env,
        "REQCRYPT_PORT": str(port),
        "REQCRYPT_NBD_PORT": str(nbd_port),
        "REQCRYPT_BENCH_CEILING": "1",
    }
    server = subprocess.Popen(
        [REQCRYPT, "serve"], env=served, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}/readyz", server)
        work = tmp_path / "work"
        work.mkdir()
        # The client's default is 127.0.0.1:8000; this service is on another port.
        yield work, {**env, "REQCRYPT_URL": f"http://127.0.0.1:{port}"}, port, nbd_port
    finally:
        server.terminate()
        server.wait(timeout=15)


@pytest.mark.slow
@pytest.mark.parametrize("guide", GUIDES)
def test_the_guide_runs_as_written(guide: str, home: tuple[Path, dict[str, str], int, int]) -> None:
    work, env, port, nbd_port = home
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script(guide, port, nbd_port)],
        env=env,
        cwd=work,
        capture_output=True,
        timeout=300,
        check=False,
    )
    shown = result.stdout[-2000:] + b"\n" + result.stderr[-3000:]
    assert result.returncode == 0, f"{guide}:\n{shown.decode(errors='replace')}"


def test_the_quickstart_starts_with_scripts_run_then_four_commands() -> None:
    (_, first), (_, cli) = blocks("docs/quickstart.md")[:2]
    assert first.strip() == "scripts/run"
    assert len(cli.strip().splitlines()) == 4


@pytest.mark.slow
def test_the_quickstart_reads_back_what_it_wrote(
    home: tuple[Path, dict[str, str], int, int],
) -> None:
    """Its CLI and curl blocks end with the read: both print the bytes written."""
    work, env, port, nbd_port = home
    for index in (1, 3):
        _, text = blocks("docs/quickstart.md")[index]
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", rewrite(text, port, nbd_port)],
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.rstrip("\n").endswith("hello, disk!"), result.stdout
