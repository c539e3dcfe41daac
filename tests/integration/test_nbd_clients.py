"""Real NBD clients (libnbd's nbdinfo and nbdcopy, qemu-io, qemu-img, fio) against
``reqcrypt serve`` with REQCRYPT_NBD_PORT set, on loopback ports."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.factories import xts_table
from tests.support.nbd_servers import NbdServer, export, running
from tests.support.vectors import CASES, stream

pytestmark = pytest.mark.e2e
MIB = 1 << 20


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NbdServer]:
    with running(tmp_path_factory.mktemp("nbd") / "data") as nbd:
        yield nbd


@pytest.fixture
def http(server: NbdServer) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


def run(*command: str, cwd: Path | None = None) -> str:
    result = subprocess.run(command, capture_output=True, timeout=300, cwd=cwd)
    assert result.returncode == 0, result.stderr.decode() + result.stdout.decode()
    return result.stdout.decode()


def test_nbdinfo_shows_size_block_sizes_and_flags(server: NbdServer, http: httpx.Client) -> None:
    export(http, "info", 8 * MIB)
    info = json.loads(run("nbdinfo", "--json", server.uri("info")))
    (found,) = info["exports"]
    assert found["export-size"] == 8 * MIB
    assert found["block_size_minimum"] == 1
    assert found["block_size_preferred"] == 512
    assert found["block_size_maximum"] == 1280 * 1024
    assert found["can_flush"] is True
    assert found["can_fua"] is True
    assert found["can_zero"] is True
    assert found["can_multi_conn"] is True
    assert found["can_trim"] is False
    assert found["is_read_only"] is False
    assert info["protocol"] == "newstyle-fixed"


def test_nbdinfo_lists_only_exported_volumes_and_trim_follows_allow_discards(
    server: NbdServer, http: httpx.Client
) -> None:
    export(http, "listed", MIB, table=xts_table("listed-pv", 2048, " 1 allow_discards"))
    assert http.post("/v1/devices", json={"name": "hidden-pv", "size_bytes": MIB}).is_success
    hidden = {"name": "hidden", "table": xts_table("hidden-pv", 2048)}
    assert http.post("/v1/volumes", json=hidden).status_code == 201
    listing = json.loads(run("nbdinfo", "--json", "--list", server.uri("")))
    names = {entry["export-name"] for entry in listing["exports"]}
    assert "listed" in names
    assert "hidden" not in names
    listed = next(entry for entry in listing["exports"] if entry["export-name"] == "listed")
    assert listed["can_trim"] is True


def test_qemu_io_pattern_writes_and_reads_aligned_and_unaligned(
    server: NbdServer, http: httpx.Client
) -> None:
    export(http, "qio", 4 * MIB)
    output = run(
        "qemu-io",
        "-f",
        "raw",
        server.uri("qio"),
        "-c",
        "write -P 0x5a 0 1M",
        "-c",
        "write -P 0xc3 1000 70001",
        "-c",
        "write -P 0x11 2097151 3",
        "-c",
        "read -P 0x5a 0 1000",
        "-c",
        "read -P 0xc3 1000 70001",
        "-c",
        "read -P 0x5a 71001 977575",
        "-c",
        "read -P 0x11 2097151 3",
        "-c",
        "flush",
    )
    assert "Pattern verification failed" not in output
    back = http.get("/v1/volumes/qio/data", headers={"Range": "bytes=999-71001"}).content
    assert back == b"\x5a" + b"\xc3" * 70001 + b"\x5a"


def test_qemu_io_detects_a_wrong_pattern(server: NbdServer, http: httpx.Client) -> None:
    """The negative control: qemu-io's read -P fails on data that is not the pattern."""
    export(http, "qneg", MIB)
    result = subprocess.run(
        [
            "qemu-io",
            "-f",
            "raw",
            server.uri("qneg"),
            "-c",
            "write -P 1 0 4096",
            "-c",
            "read -P 2 0 4096",
        ],
        capture_output=True,
        timeout=60,
    )
    assert b"Pattern verification failed" in result.stdout


def test_qemu_img_convert_into_the_export_then_compare(
    server: NbdServer, http: httpx.Client, tmp_path: Path
) -> None:
    size = 16 * MIB
    export(http, "qimg", size)
    image = tmp_path / "source.raw"
    image.write_bytes(stream("nbd-qemu-img", size))
    run("qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", str(image), server.uri("qimg"))
    run("qemu-img", "compare", "-f", "raw", "-F", "raw", str(image), server.uri("qimg"))
    image.write_bytes(b"x" + image.read_bytes()[1:])
    different = subprocess.run(
        ["qemu-img", "compare", "-f", "raw", "-F", "raw", str(image), server.uri("qimg")],
        capture_output=True,
        timeout=60,
    )
    assert different.returncode == 1


def test_nbdcopy_both_ways(server: NbdServer, http: httpx.Client, tmp_path: Path) -> None:
    size = 8 * MIB
    export(http, "copy", size)
    source = tmp_path / "in.raw"
    source.write_bytes(stream("nbd-nbdcopy", size))
    run("nbdcopy", str(source), server.uri("copy"))
    target = tmp_path / "out.raw"
    run("nbdcopy", server.uri("copy"), str(target))
    assert target.read_bytes() == source.read_bytes()
    assert http.get("/v1/volumes/copy/data").content == source.read_bytes()


def test_fio_random_writes_verify_crc32c(
    server: NbdServer, http: httpx.Client, tmp_path: Path
) -> None:
    export(http, "fio", 16 * MIB)
    output = run(
        "fio",
        "--name=verify",
        "--ioengine=nbd",
        f"--uri={server.uri('fio')}",
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=32",
        "--size=16M",
        "--verify=crc32c",
        "--do_verify=1",
        "--output-format=json",
        cwd=tmp_path,  # fio leaves its verify state file in the working directory
    )
    job = json.loads(output[output.index("{") :])["jobs"][0]
    assert job["error"] == 0
    assert job["write"]["io_bytes"] == 16 * MIB
    assert job["read"]["io_bytes"] == 16 * MIB  # the verify pass read everything back
    status = http.get("/v1/volumes/fio/status").json()
    assert status["nbd"]["requests"]["write"] == 4096
    assert status["stats"]["w_bios"] == 4096


@pytest.mark.parametrize(
    "case_name", ["aes-xts-plain64-k64", "aes-cbc-essiv-sha256", "aes-xts-plain64-ss4096"]
)
def test_nbd_writes_the_ciphertext_the_kernel_wrote(
    server: NbdServer, http: httpx.Client, tmp_path: Path, case_name: str
) -> None:
    """The kernel fixtures' plaintext written through NBD leaves the kernel's backing image,
    and reads back over HTTP."""
    case = CASES[case_name]
    assert "backing_init" not in case
    device = f"kfx-{case_name}"
    size = case["backing_size"]
    assert http.post("/v1/devices", json={"name": device, "size_bytes": size}).is_success
    (line,) = case["table"]
    for index, recipe in enumerate(case["keys"]):
        line = line.replace(f"{{key{index}}}", stream(recipe["seed"], recipe["size"]).hex())
    table = line.replace("{dev}", device)
    name = f"k-{case_name}"
    response = http.post("/v1/volumes", json={"name": name, "table": table, "nbd_export": True})
    assert response.status_code == 201, response.text
    plaintext = stream(case["plaintext"]["seed"], case["plaintext"]["size"])
    source = tmp_path / "plain.raw"
    source.write_bytes(plaintext)
    run("nbdcopy", "--flush", str(source), server.uri(name))
    backing = server.data_dir / "devices" / f"{device}.img"
    assert hashlib.sha256(backing.read_bytes()).hexdigest() == case["kernel"]["backing_sha256"]
    assert http.get(f"/v1/volumes/{name}/data").content == plaintext
