"""The README's run command, exactly as a new user types it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.ports import free_port, wait_ready

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def readme_command(index: int) -> str:
    """The n-th indented command block of the README's first lines."""
    commands = [
        line.strip()
        for line in (ROOT / "README.md").read_text().splitlines()[:12]
        if line.startswith("    ")
    ]
    return commands[index]


def test_readme_test_command_is_what_ci_runs() -> None:
    assert readme_command(1) == "scripts/test"
    assert "exec scripts/test" in (ROOT / ".ci" / "run").read_text()


def test_readme_run_command_serves_docs_health_and_asks_for_a_token(tmp_path: Path) -> None:
    command = readme_command(0)
    assert command == "scripts/run"
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("REQCRYPT_")},
        "HOME": str(tmp_path),
        "XDG_DATA_HOME": str(tmp_path / "share"),
        "REQCRYPT_PORT": str(port),
    }
    log = tmp_path / "run.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [str(ROOT / command)], cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT
        )
        try:
            base = f"http://127.0.0.1:{port}"
            wait_ready(f"{base}/healthz", process)
            assert httpx.get(f"{base}/docs").status_code == 200
            assert httpx.get(f"{base}/v1/volumes").status_code == 401
            token_file = tmp_path / "share" / "reqcrypt" / "admin.token"
            assert oct(token_file.stat().st_mode & 0o777) == "0o600"
            token = token_file.read_text().strip()
            authorized = httpx.get(
                f"{base}/v1/volumes", headers={"Authorization": f"Bearer {token}"}
            )
            assert authorized.status_code == 200
        finally:
            process.terminate()
            process.wait(timeout=15)
    printed = log.read_text()
    assert f"http://localhost:{port}/docs" in printed
    assert str(token_file) in printed


def setup_with_fake_apt(tmp_path: Path, *args: str, **env: str) -> list[str]:
    """Run scripts/setup where no test tool is installed and apt-get only records its calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "apt-calls"
    (bin_dir / "apt-get").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    (bin_dir / "dpkg").write_text("#!/bin/sh\nexit 1\n")  # nothing is installed
    for fake in ("apt-get", "dpkg"):
        (bin_dir / fake).chmod(0o755)
    for tool in ("dirname", "id", "cc", "mkdir", "ln", "sh", "cat"):
        found = shutil.which(tool)
        assert found is not None, tool
        (bin_dir / tool).symlink_to(found)
    subprocess.run(
        [shutil.which("bash") or "bash", str(ROOT / "scripts" / "setup"), *args],
        env={"PATH": str(bin_dir), "HOME": str(tmp_path), **env},
        check=True,
        capture_output=True,
        timeout=120,
    )
    return calls.read_text().splitlines() if calls.exists() else []


def test_setup_for_serving_installs_no_test_tool(tmp_path: Path) -> None:
    assert setup_with_fake_apt(tmp_path) == []


def test_setup_for_serving_rbd_installs_only_the_ceph_client(tmp_path: Path) -> None:
    (call,) = setup_with_fake_apt(tmp_path, REQCRYPT_CEPH_CONF="/etc/ceph/ceph.conf")
    assert call.split()[-3:] == ["ceph-common", "python3-rbd", "python3-rados"]


def test_setup_for_tests_installs_the_test_tools(tmp_path: Path) -> None:
    installed = " ".join(setup_with_fake_apt(tmp_path, "--test")).split()
    for package in ("qemu-utils", "libnbd-bin", "fio", "chromium", "ceph-mon", "ceph-osd"):
        assert package in installed


def test_setup_for_serving_links_the_installed_rbd_bindings_into_the_venv(tmp_path: Path) -> None:
    """Without REQCRYPT_CEPH_CONF nor --test: Debian's bindings, once installed, are linked
    anyway (the RBD tests and rbd devices need them). A copy of the tree with a venv of its
    own and reqcrypt marked installed, so only the setup script's own steps run."""
    dist = Path("/usr/lib/python3/dist-packages")
    assert list(dist.glob("rbd.cpython-311-*.so")), "scripts/setup --test installs python3-rbd"
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "setup", tree / "scripts" / "setup")
    (tree / "app").mkdir()
    for name in ("pyproject.toml", "setup.py", "app/_native.c"):
        (tree / name).touch()
    venv = tree / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (venv / ".reqcrypt-installed").touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith("REQCRYPT_")}
    done = subprocess.run(
        [str(tree / "scripts" / "setup")], env=env, capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout + done.stderr) == (0, "")
    imported = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import rados, rbd; print(rbd.__file__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.startswith(str(venv / "ceph-bindings"))
