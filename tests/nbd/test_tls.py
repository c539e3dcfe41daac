"""NBD over TLS: STARTTLS with the server's x509 certificate and verified client certificates."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from pydantic import ValidationError

from app.config import Settings
from app.main import create_app
from app.nbd.protocol import Command, Option, Reply
from tests.support.app import ADMIN_TOKEN
from tests.support.certs import make_pki
from tests.support.factories import make_device, make_volume, xts_table
from tests.support.nbd_client import RawClient
from tests.support.nbd_servers import NbdServer, running

MIB = 1 << 20


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls_settings(pki: Path) -> dict[str, Path]:
    return {
        "nbd_tls_cert": pki / "server-cert.pem",
        "nbd_tls_key": pki / "server-key.pem",
        "nbd_tls_ca": pki / "ca-cert.pem",
    }


def test_nbd_outside_loopback_without_tls_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="needs TLS"):
        Settings(data_dir=tmp_path, host="0.0.0.0", nbd_port=10809)  # type: ignore[arg-type]


def test_nbd_outside_loopback_with_tls_is_accepted(tmp_path: Path, pki: Path) -> None:
    settings = Settings(data_dir=tmp_path, host="0.0.0.0", nbd_port=10809, **tls_settings(pki))  # type: ignore[arg-type]
    assert settings.nbd_tls_ca == pki / "ca-cert.pem"


def test_half_a_tls_configuration_is_refused(tmp_path: Path, pki: Path) -> None:
    with pytest.raises(ValidationError, match="all of"):
        Settings(data_dir=tmp_path, nbd_port=10809, nbd_tls_cert=pki / "server-cert.pem")  # type: ignore[arg-type]


@pytest.fixture
async def app(data_dir: Path, pki: Path) -> AsyncIterator[FastAPI]:
    settings = Settings(
        data_dir=data_dir,
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
        nbd_port=0,
        **tls_settings(pki),
    )
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        yield application


def client_context(pki: Path, *, with_certificate: bool = True) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca-cert.pem"))
    if with_certificate:
        context.load_cert_chain(pki / "client-cert.pem", pki / "client-key.pem")
    return context


@pytest.mark.anyio
async def test_options_before_starttls_need_tls_then_io_flows_over_tls(
    app: FastAPI, client: httpx.AsyncClient, pki: Path
) -> None:
    await make_device(client, "pv", MIB)
    await make_volume(client, "vol", xts_table("pv", 2048), nbd_export=True)
    port = app.state.reqcrypt.nbd.port
    raw = await RawClient.connect(port)
    (refused,) = await raw.option(Option.LIST)
    assert refused.reply == Reply.ERR_TLS_REQD
    await raw.start_tls(client_context(pki))
    (again,) = await raw.option(Option.STARTTLS)
    assert again.reply == Reply.ERR_INVALID
    replies = await raw.option(Option.GO, raw.info_data("vol"))
    assert replies[-1].reply == Reply.ACK
    assert (await raw.request(Command.WRITE, 0, 512, payload=b"\x07" * 512)).error == 0
    assert (await raw.request(Command.READ, 0, 512)).data == b"\x07" * 512
    info = (await client.get("/v1/volumes/vol")).json()
    assert info["nbd_connections"][0]["tls"] is True
    await raw.close()


@pytest.mark.anyio
async def test_export_name_before_tls_closes_the_session(app: FastAPI) -> None:
    raw = await RawClient.connect(app.state.reqcrypt.nbd.port)
    raw.send_option(Option.EXPORT_NAME, b"vol")
    assert await raw.closed_by_server()


@pytest.mark.anyio
async def test_a_client_without_a_certificate_is_refused(app: FastAPI, pki: Path) -> None:
    raw = await RawClient.connect(app.state.reqcrypt.nbd.port)
    with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):  # noqa: PT012
        await raw.start_tls(client_context(pki, with_certificate=False))
        await raw.option(Option.LIST)
    await raw.close()


@pytest.fixture
def tls_server(tmp_path: Path, pki: Path) -> Iterator[NbdServer]:
    with running(tmp_path / "data", pki) as nbd:
        yield nbd


@pytest.mark.e2e
def test_nbdinfo_and_qemu_io_over_tls_with_client_certificates(
    tls_server: NbdServer, pki: Path
) -> None:
    with tls_server.client() as http:
        assert http.post("/v1/devices", json={"name": "pv", "size_bytes": MIB}).is_success
        body = {"name": "vol", "table": xts_table("pv", 2048), "nbd_export": True}
        assert http.post("/v1/volumes", json=body).status_code == 201
    port = tls_server.nbd_port
    uri = f"nbds://localhost:{port}/vol?tls-certificates={pki}"
    result = subprocess.run(["nbdinfo", "--json", uri], capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr.decode()
    info = json.loads(result.stdout)
    assert info["TLS"] is True
    assert info["exports"][0]["export-size"] == MIB
    plain = subprocess.run(
        ["nbdinfo", f"nbd://localhost:{port}/vol"], capture_output=True, timeout=60
    )
    assert plain.returncode != 0
    qemu = subprocess.run(
        [
            "qemu-io", "--object", f"tls-creds-x509,id=tls0,dir={pki},endpoint=client",
            "--image-opts", f"driver=nbd,host=localhost,port={port},export=vol,tls-creds=tls0",
            "-c", "write -P 0x3c 512 4096", "-c", "read -P 0x3c 512 4096",
        ],
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    assert qemu.returncode == 0, qemu.stderr.decode() + qemu.stdout.decode()
    assert b"Pattern verification failed" not in qemu.stdout
