"""The compose deployment, checked structurally and by running its entrypoint outside Docker."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.ports import free_port, wait_ready

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def test_compose_has_app_and_postgres_with_healthchecks() -> None:
    services = compose()["services"]
    default = {name for name, service in services.items() if "profiles" not in service}
    assert default == {"app", "postgres"}
    assert "healthcheck" in services["app"]
    assert "healthcheck" in services["postgres"]


def test_the_cluster_profile_adds_a_node_on_apps_database_data_and_key() -> None:
    """No second master key: every node is ``app`` with its own id and URL, on app's volume."""
    services = compose()["services"]
    app = services["app"]
    nodes = {name: s for name, s in services.items() if name in ("app", "node-b")}
    assert {n for n, s in services.items() if "cluster" in s.get("profiles", [])} == {"node-b"}
    ids = {node["environment"]["REQCRYPT_NODE_ID"] for node in nodes.values()}
    assert ids == {"node-a", "node-b"}
    for name, node in nodes.items():
        environment = node["environment"]
        assert environment["REQCRYPT_NODE_URL"] == f"http://{name}:8000"
        assert environment["REQCRYPT_DATABASE_URL"] == app["environment"]["REQCRYPT_DATABASE_URL"]
        assert environment["REQCRYPT_CLUSTER_DATA_PATH"] == "proxy"  # no 307 to a name inside
        assert "REQCRYPT_MASTER_KEY" not in environment
        assert "REQCRYPT_MASTER_KEY_FILE" not in environment
        assert node["volumes"] == ["appdata:/var/lib/reqcrypt"]
        assert node["env_file"] == [".env"]
        assert node["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert node["restart"] == "unless-stopped"
        assert "healthcheck" in node


def test_app_waits_for_a_healthy_postgres() -> None:
    app = compose()["services"]["app"]
    assert app["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_data_lives_on_named_volumes() -> None:
    spec = compose()
    assert {"pgdata", "appdata"} <= set(spec["volumes"])
    assert "pgdata:/var/lib/postgresql/data" in spec["services"]["postgres"]["volumes"]
    assert "appdata:/var/lib/reqcrypt" in spec["services"]["app"]["volumes"]


def test_secrets_come_from_the_env_file_not_the_image() -> None:
    app = compose()["services"]["app"]
    assert app["env_file"] == [".env"]
    environment = app["environment"]
    for secret in ("REQCRYPT_MASTER_KEY", "REQCRYPT_ADMIN_TOKEN", "REQCRYPT_IO_TOKEN"):
        assert secret not in environment
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "MASTER_KEY" not in dockerfile
    assert "TOKEN" not in dockerfile
    assert "USER reqcrypt" in dockerfile
    assert "HEALTHCHECK" in dockerfile


def test_the_image_builds_the_wheel_from_what_the_wheel_test_builds_it_from() -> None:
    """No docker here: the build stage must copy every input the tested wheel build uses."""
    from tests.support.build import BUILD_INPUTS, IMAGE_LOCK

    build_stage = (ROOT / "Dockerfile").read_text().split("FROM ")[1]
    copied = {
        word.rstrip("/")
        for line in build_stage.splitlines()
        if line.startswith("COPY ")
        for word in line.split()[1:-1]
    }
    assert copied == {*BUILD_INPUTS, IMAGE_LOCK}
    assert "pip wheel --no-cache-dir --no-deps --no-build-isolation" in build_stage


def test_every_package_in_the_image_comes_from_the_lock_checked_by_hash() -> None:
    """Both stages install the runtime lock with --require-hashes (no resolver at build
    time), and the wheel itself goes in without its dependencies."""
    from tests.support.build import IMAGE_LOCK

    dockerfile = (ROOT / "Dockerfile").read_text()
    installs = [line for line in dockerfile.splitlines() if line.startswith("RUN pip install")]
    assert len(installs) == 2
    assert all("--require-hashes" in line for line in installs)
    assert installs[0].endswith(f"-r {IMAGE_LOCK}")
    assert installs[1].endswith("-r /tmp/runtime.txt \\")
    assert f"COPY {IMAGE_LOCK} /tmp/runtime.txt" in dockerfile
    assert "pip install --no-deps /tmp/wheels/*.whl" in dockerfile


@pytest.fixture
def served(postgres_url: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """``reqcrypt serve`` (the image's ENTRYPOINT + CMD) with the compose environment."""
    app = compose()["services"]["app"]
    port = free_port()
    admin = secrets.token_hex(16)
    env = {k: str(v) for k, v in app["environment"].items()}
    env.update(
        REQCRYPT_DATABASE_URL=postgres_url,  # the compose URL, pointed at this machine
        REQCRYPT_DATA_DIR=str(tmp_path / "data"),
        REQCRYPT_PORT=str(port),
        REQCRYPT_MASTER_KEY=secrets.token_hex(32),
        REQCRYPT_ADMIN_TOKEN=admin,
        REQCRYPT_IO_TOKEN=secrets.token_hex(16),
    )
    command = [str(Path(sys.executable).with_name("reqcrypt")), *app["command"]]
    process = subprocess.Popen(
        command,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(f"{base}/readyz", process)
        yield base, admin
    finally:
        process.terminate()
        process.wait(timeout=15)
        if process.stdout is not None:
            process.stdout.close()


@pytest.mark.postgres
@pytest.mark.e2e
def test_entrypoint_serves_on_postgres_with_the_compose_environment(
    served: tuple[str, str],
) -> None:
    base, admin = served
    assert httpx.get(f"{base}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{base}/docs").status_code == 200
    assert httpx.get(f"{base}/v1/devices").status_code == 401
    auth = {"Authorization": f"Bearer {admin}"}
    created = httpx.post(
        f"{base}/v1/devices", json={"name": "pv", "size_bytes": 1 << 20}, headers=auth
    )
    assert created.status_code == 201


def env_example() -> dict[str, str]:
    """.env.example as docker compose reads it: KEY=VALUE lines, comments skipped."""
    values = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


@pytest.mark.postgres
@pytest.mark.e2e
def test_entrypoint_becomes_healthy_with_exactly_the_env_example(
    postgres_url: str, tmp_path: Path
) -> None:
    """`cp .env.example .env` (new POSTGRES_PASSWORD only), then what `docker compose up` runs."""
    env = env_example()
    assert {"REQCRYPT_MASTER_KEY", "REQCRYPT_ADMIN_TOKEN", "REQCRYPT_IO_TOKEN"} <= set(env)
    env["POSTGRES_PASSWORD"] = secrets.token_hex(8)
    app = compose()["services"]["app"]
    for key, value in app["environment"].items():
        env[key] = str(value).replace("${POSTGRES_PASSWORD}", env["POSTGRES_PASSWORD"])
    compose_url = env["REQCRYPT_DATABASE_URL"]
    assert compose_url.endswith("@postgres:5432/reqcrypt")
    # Only the host differs: this machine's PostgreSQL (trust auth) stands in for the service.
    env["REQCRYPT_DATABASE_URL"] = postgres_url
    env["REQCRYPT_DATA_DIR"] = str(tmp_path / "data")
    port = free_port()
    env["REQCRYPT_PORT"] = str(port)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REQCRYPT_")}
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("reqcrypt")), *app["command"]],
        env={**clean, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(f"{base}/healthz", process)
        wait_ready(f"{base}/readyz", process)
        token_file = tmp_path / "data" / "admin.token"
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
        assert oct((tmp_path / "data" / "master.key").stat().st_mode & 0o777) == "0o600"
        auth = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        assert httpx.get(f"{base}/v1/devices", headers=auth).status_code == 200
    finally:
        process.terminate()
        process.wait(timeout=15)
    assert process.stdout is not None
    output = process.stdout.read().decode()
    process.stdout.close()
    assert str(token_file) in output
    assert str(tmp_path / "data" / "master.key") in output
    assert "Traceback" not in output
