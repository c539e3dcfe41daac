"""The shipped Dockerfile and docker-compose.yml, run for real: both profiles come up
healthy, take the README's tour, survive a restart of every container, and read the
data back through every published port.

Needs root, a Docker daemon and Compose v2: ``../shared/tools/local-images`` (found
from the repository root) provides them with stand-in base images. Minutes long, so
not in the test command: ``.venv/bin/pytest -m docker tests/integration/test_compose.py``.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.docker

LOCAL_IMAGES = ROOT.parent / "shared" / "tools" / "local-images" / "local-images"
PAYLOAD = secrets.token_bytes(64 << 10)
XTS_KEY = secrets.token_hex(64)


def run(*command: str, cwd: Path | None = None, timeout: float = 900) -> str:
    done = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def image() -> str:
    """The daemon up and the image built from the shipped Dockerfile."""
    assert LOCAL_IMAGES.exists(), f"{LOCAL_IMAGES} is needed"
    run(str(LOCAL_IMAGES), "up")
    run("docker", "build", "--network", "host", "-t", "reqcrypt:latest", ".", cwd=ROOT)
    return "reqcrypt:latest"


class Deployment:
    """The compose file as a user runs it, in a directory of its own with its own .env;
    an override only moves the published ports to free ones."""

    def __init__(self, directory: Path, profile: str | None) -> None:
        self.directory = directory
        self.project = f"reqcrypt-test-{secrets.token_hex(4)}"
        self.profile = profile
        self.admin = secrets.token_urlsafe(24)
        shutil.copy(ROOT / "docker-compose.yml", directory / "docker-compose.yml")
        env = (ROOT / ".env.example").read_text()
        env = env.replace(
            "POSTGRES_PASSWORD=change-me", f"POSTGRES_PASSWORD={secrets.token_hex(8)}"
        )
        env = env.replace("REQCRYPT_ADMIN_TOKEN=", f"REQCRYPT_ADMIN_TOKEN={self.admin}")
        (directory / ".env").write_text(env)
        services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
        self.ports: dict[str, int] = {}
        override: dict[str, dict[str, object]] = {}
        for name, service in services.items():
            if "ports" in service and set(service.get("profiles", [])) <= {profile}:
                self.ports[name] = free_port()
                override[name] = {"ports": [f"127.0.0.1:{self.ports[name]}:8000"]}
        text = yaml.safe_dump({"services": override})
        # !override: replace the published ports instead of adding to them (Compose v2.24+).
        text = text.replace("ports:\n", "ports: !override\n")
        (directory / "override.yml").write_text(text)

    def compose(self, *args: str, timeout: float = 600) -> str:
        profile = ["--profile", self.profile] if self.profile else []
        return run(
            "docker", "compose", "-p", self.project, "-f", "docker-compose.yml",
            "-f", "override.yml", *profile, *args,
            cwd=self.directory, timeout=timeout,
        )  # fmt: skip

    def up(self) -> None:
        self.compose("up", "-d", "--no-build", "--wait", "--wait-timeout", "300")

    def wait_healthy(self) -> None:
        """After a restart: every container healthy again (compose's own view)."""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            states = self.compose("ps", "--format", "{{.Service}} {{.Health}}").split("\n")
            health = dict(line.split(" ", 1) for line in states if line.strip())
            if health and all(state == "healthy" for state in health.values()):
                return
            time.sleep(2)
        raise AssertionError(f"not healthy after a restart: {health}")

    def client(self, service: str) -> httpx.Client:
        return httpx.Client(
            base_url=f"http://127.0.0.1:{self.ports[service]}",
            headers={"Authorization": f"Bearer {self.admin}"},
            timeout=60,
            follow_redirects=False,
        )

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans")


@pytest.fixture(params=[None, "cluster"], ids=["single", "cluster"])
def deployment(image: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Deployment]:
    deployed = Deployment(tmp_path, request.param)
    try:
        deployed.up()
        yield deployed
    finally:
        logs = subprocess.run(
            ["docker", "compose", "-p", deployed.project, "logs", "--no-color", "--tail", "50"],
            cwd=tmp_path, capture_output=True, text=True, check=False,
        )  # fmt: skip
        print(logs.stdout[-6000:])  # noqa: T201 (pytest shows it when the test fails)
        deployed.down()


def read_back(deployment: Deployment) -> None:
    """Through every published port, the bytes written, never a redirect."""
    for service in deployment.ports:
        with deployment.client(service) as client:
            deadline = time.monotonic() + 120
            while True:
                response = client.get("/v1/volumes/vault/data", headers={"Range": "bytes=0-65535"})
                # Right after a restart the volume's lease may still be moving: 503 + Retry-After.
                if response.status_code != 503 or time.monotonic() > deadline:
                    break
                time.sleep(float(response.headers.get("retry-after", "1")))
            assert response.status_code == 206, (service, response.status_code, response.text)
            assert response.content == PAYLOAD, service


def test_compose_up_tour_restart_every_container_and_read_back(deployment: Deployment) -> None:
    first = next(iter(deployment.ports))
    with deployment.client(first) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.get("/readyz").status_code == 200
        created = client.post("/v1/devices", json={"name": "pv", "size_bytes": 4 << 20})
        assert created.status_code == 201, created.text
        table = f"0 8192 crypt aes-xts-plain64 {XTS_KEY} 0 pv 0"
        created = client.post("/v1/volumes", json={"name": "vault", "table": table})
        assert created.status_code == 201, created.text
    last = list(deployment.ports)[-1]  # in the cluster, another node than the one that made it
    with deployment.client(last) as client:
        written = client.put(
            "/v1/volumes/vault/data",
            content=PAYLOAD,
            headers={"Content-Range": f"bytes 0-{len(PAYLOAD) - 1}/*"},
        )
        assert written.status_code == 204, written.text
        assert client.post("/v1/volumes/vault/flush").status_code == 204
    read_back(deployment)

    services = ["postgres", *deployment.ports]
    for service in services:
        deployment.compose("restart", service)
        deployment.wait_healthy()
        read_back(deployment)
    with deployment.client(first) as client:
        key = client.get("/v1/volumes/vault/table", params={"show_keys": "true"}).text
        assert XTS_KEY in key
