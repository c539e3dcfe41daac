"""``reqcrypt serve`` with an NBD port, for the tests and benchmarks that drive real clients."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.factories import xts_table
from tests.support.ports import free_port
from tests.support.servers import Server


class NbdServer(Server):
    """With ``pki`` (``tests.support.certs.make_pki``), TLS is forced and client certificates
    are verified."""

    def __init__(self, data_dir: Path, pki: Path | None = None) -> None:
        self.nbd_port = free_port()
        self.pki = pki
        env = {"REQCRYPT_NBD_PORT": str(self.nbd_port)}
        if pki is not None:
            env.update(
                REQCRYPT_NBD_TLS_CERT=str(pki / "server-cert.pem"),
                REQCRYPT_NBD_TLS_KEY=str(pki / "server-key.pem"),
                REQCRYPT_NBD_TLS_CA=str(pki / "ca-cert.pem"),
            )
        super().__init__(data_dir, **env)

    def uri(self, name: str) -> str:
        return f"nbd://127.0.0.1:{self.nbd_port}/{name}"


@contextmanager
def running(data_dir: Path, pki: Path | None = None) -> Iterator[NbdServer]:
    server = NbdServer(data_dir, pki)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def export(client: httpx.Client, name: str, size: int, table: str | None = None) -> None:
    """A device of ``size`` bytes and an exported volume on it (aes-xts-plain64 by default)."""
    response = client.post("/v1/devices", json={"name": f"{name}-pv", "size_bytes": size})
    assert response.status_code == 201, response.text
    response = client.post(
        "/v1/volumes",
        json={
            "name": name,
            "table": table or xts_table(f"{name}-pv", size // 512),
            "nbd_export": True,
        },
    )
    assert response.status_code == 201, response.text


def make_export(http: httpx.Client, name: str, table: str, **fields: object) -> None:
    response = http.post(
        "/v1/volumes", json={"name": name, "table": table, "nbd_export": True, **fields}
    )
    assert response.status_code == 201, response.text
