"""The client commands (dev, io, iostat, engines, bench http) against a real uvicorn.

The service writes its admin token file (REQCRYPT_ADMIN_TOKEN is empty, so unset),
and the commands find the service and the token the way a local user's would:
REQCRYPT_URL and the token file of REQCRYPT_DATA_DIR, with no flag.
"""

from __future__ import annotations

import os
import pty
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.factories import xts_table
from tests.support.servers import Server

pytestmark = pytest.mark.e2e
REQCRYPT = str(Path(sys.executable).with_name("reqcrypt"))
MIB = 1 << 20


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("client") / "data", REQCRYPT_ADMIN_TOKEN="")
    running.start()
    try:
        yield running
    finally:
        running.stop()


def environment(server: Server) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REQCRYPT_")}
    return {
        **clean,
        "REQCRYPT_URL": server.base,
        "REQCRYPT_DATA_DIR": str(server.data_dir),
        "COLUMNS": "200",  # usage errors in one line
    }


def reqcrypt(
    server: Server, *args: str, stdin: bytes | None = None, ok: bool = True
) -> subprocess.CompletedProcess[bytes]:
    result = subprocess.run(
        [REQCRYPT, *args],
        input=stdin,
        capture_output=True,
        env=environment(server),
        timeout=120,
        check=False,
    )
    if ok:
        assert result.returncode == 0, result.stderr.decode()
    return result


def admin(server: Server) -> httpx.Client:
    token = (server.data_dir / "admin.token").read_text().strip()
    return httpx.Client(
        base_url=server.base, headers={"Authorization": f"Bearer {token}"}, timeout=60
    )


def make_volume(server: Server, name: str, size: int = 8 * MIB) -> None:
    reqcrypt(server, "dev", "create", f"{name}-pv", f"{size // MIB}M")
    table = xts_table(f"{name}-pv", size // 512)
    reqcrypt(server, "dmsetup", "create", name, "--table", table)


@pytest.mark.slow
def test_dev_create_ls_rm_with_sizes_and_a_model(server: Server) -> None:
    reqcrypt(server, "dev", "create", "small", "64M")
    reqcrypt(server, "dev", "create", "card", "1G", "--model", "sdcard-bbb")
    with admin(server) as client:
        devices = {d["name"]: d for d in client.get("/v1/devices").json()}
    assert devices["small"]["size_bytes"] == 64 * MIB
    assert (devices["card"]["size_bytes"], devices["card"]["model"]) == (1 << 30, "sdcard-bbb")
    listing = reqcrypt(server, "dev", "ls").stdout.decode().splitlines()
    assert listing[0].split() == ["NAME", "SIZE", "ALLOC", "MODEL", "MAPPED", "BY"]
    assert ["card", "1G", "0", "sdcard-bbb", "-"] in [line.split() for line in listing]
    reqcrypt(server, "dev", "rm", "small")
    reqcrypt(server, "dev", "rm", "card")
    names = [line.split()[0] for line in reqcrypt(server, "dev", "ls").stdout.decode().splitlines()]
    assert "small" not in names
    assert "card" not in names


@pytest.mark.slow
def test_user_errors_are_the_problem_detail_on_stderr_without_traceback(server: Server) -> None:
    odd = reqcrypt(server, "dev", "create", "odd", "1000", ok=False)
    assert odd.returncode == 1
    assert odd.stderr.decode() == (
        "reqcrypt: POST /v1/devices: 422 body.size_bytes: Input should be a multiple of 512\n"
    )
    bad_size = reqcrypt(server, "dev", "create", "odd", "12X", ok=False)
    assert bad_size.returncode == 2
    assert "expected a number with an optional k/m/g suffix" in bad_size.stderr.decode()
    missing = reqcrypt(server, "io", "read", "novolume", "--length", "4k", ok=False)
    assert missing.returncode == 1
    assert (
        missing.stderr.decode()
        == "reqcrypt: GET /v1/volumes/novolume: 404 volume novolume not found\n"
    )
    assert missing.stdout == b""
    no_file = reqcrypt(server, "io", "write", "novolume", "/nonexistent/file", ok=False)
    assert no_file.stderr.decode() == "reqcrypt: /nonexistent/file: No such file or directory\n"
    wrong_token = reqcrypt(server, "dev", "ls", "--token", "x" * 20, ok=False)
    assert wrong_token.returncode == 1
    assert "401 invalid bearer token (pass --token" in wrong_token.stderr.decode()
    unreachable = reqcrypt(server, "dev", "ls", "--url", "http://127.0.0.1:9", ok=False)
    assert unreachable.stderr.decode().startswith("reqcrypt: cannot reach http://127.0.0.1:9")
    no_ceph = reqcrypt(server, "dev", "create", "r", "4M", "--store", "rbd", ok=False)
    assert no_ceph.stderr.decode() == (
        "reqcrypt: POST /v1/devices: 422 store rbd is not available: "
        "REQCRYPT_CEPH_CONF is not set\n"
    )
    pool_on_file = reqcrypt(server, "dev", "create", "f", "4M", "--pool", "rbd", ok=False)
    assert "pool applies only" in pool_on_file.stderr.decode()
    for result in (odd, bad_size, missing, no_file, wrong_token, unreachable, no_ceph):
        assert b"Traceback" not in result.stderr


@pytest.mark.slow
def test_io_write_then_read_round_trips_files_and_pipes(server: Server, tmp_path: Path) -> None:
    make_volume(server, "rt")
    payload = random.Random(7).randbytes(5 * MIB + 123)  # more than one 4 MiB chunk, unaligned
    source = tmp_path / "in.bin"
    source.write_bytes(payload)
    reqcrypt(server, "io", "write", "rt", str(source), "--offset", "1M")
    out = tmp_path / "out.bin"
    reqcrypt(
        server, "io", "read", "rt", "--offset", "1M", "--length", str(len(payload)), "-o", str(out)
    )
    assert out.read_bytes() == payload
    reqcrypt(server, "io", "write", "rt", "-", "--offset", "100", stdin=b"through a pipe")
    piped = reqcrypt(server, "io", "read", "rt", "--offset", "100", "--length", "14").stdout
    assert piped == b"through a pipe"
    whole = reqcrypt(server, "io", "read", "rt").stdout
    assert len(whole) == 8 * MIB
    assert whole[MIB + 123 : MIB + len(payload)] == payload[123:]
    with admin(server) as client:
        assert client.get("/v1/volumes/rt/data", headers={"Range": "bytes=100-113"}).content == (
            b"through a pipe"
        )


def test_io_draws_a_progress_bar_on_a_terminal_only(server: Server, tmp_path: Path) -> None:
    make_volume(server, "bar")
    source = tmp_path / "in.bin"
    source.write_bytes(b"\1" * MIB)
    piped = reqcrypt(server, "io", "write", "bar", str(source))
    assert piped.stderr == b""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [REQCRYPT, "io", "write", "bar", str(source)],
        stderr=follower,
        stdout=subprocess.DEVNULL,
        env={**environment(server), "COLUMNS": "100"},
    )
    os.close(follower)
    shown = b""
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:  # the terminal's other end closed
            break
        if not data:
            break
        shown += data
    assert process.wait(timeout=60) == 0
    os.close(leader)
    assert b"write bar" in shown
    assert b"1.0/1.0 MiB" in shown


def test_io_to_a_suspended_volume_says_at_once_it_waits_for_a_resume(server: Server) -> None:
    make_volume(server, "held", size=1 * MIB)
    with admin(server) as client:
        client.post("/v1/volumes/held/suspend", json={}).raise_for_status()
        reader = subprocess.Popen(
            [REQCRYPT, "io", "read", "held", "--length", "4k"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=environment(server),
        )
        assert reader.stderr is not None
        first = reader.stderr.readline().decode()
        client.post("/v1/volumes/held/resume").raise_for_status()
        out, _ = reader.communicate(timeout=60)
    assert first == (
        "reqcrypt: io read held: volume held is suspended: waiting up to 30 s for a resume\n"
    )
    assert (reader.returncode, len(out)) == (0, 4096)


def stats_of(server: Server, name: str) -> dict[str, float]:
    with admin(server) as client:
        stats: dict[str, float] = client.get(f"/v1/volumes/{name}/status").json()["stats"]
        return stats


def test_iostat_x_prints_iostat_columns_from_the_stats_deltas(server: Server) -> None:
    make_volume(server, "st")
    with admin(server) as client:
        for offset in range(0, 64 * 4096, 4096):  # 64 sequential 4 KiB writes
            client.put(
                "/v1/volumes/st/data",
                content=b"\0" * 4096,
                headers={"Content-Range": f"bytes {offset}-{offset + 4095}/*"},
            ).raise_for_status()
    stats = stats_of(server, "st")
    output = reqcrypt(server, "iostat", "-x", "st", "0.2", "2").stdout.decode()
    first, second = (block.splitlines() for block in output.strip().split("\n\n"))
    header = first[0].split()
    assert header == [
        "Device",
        "r/s",
        "w/s",
        "rkB/s",
        "wkB/s",
        "rrqm/s",
        "wrqm/s",
        "%rrqm",
        "%wrqm",
        "r_await",
        "w_await",
        "aqu-sz",
        "rareq-sz",
        "wareq-sz",
        "%util",
    ]
    row = dict(zip(header[1:], map(float, first[1].split()[1:]), strict=True))
    assert first[1].split()[0] == "st"
    # The first report covers the time since the statistics began.
    assert row["wareq-sz"] == pytest.approx(stats["wareq_sz"], abs=0.01)
    assert row["w_await"] == pytest.approx(stats["w_await"], abs=0.01)
    assert row["w/s"] > 0
    assert row["wkB/s"] == pytest.approx(row["w/s"] * row["wareq-sz"], rel=0.01)
    assert row["r/s"] == 0
    # The second covers the interval, in which nothing happened.
    assert [float(v) for v in second[1].split()[1:]] == [0.0] * 14


def test_iostat_without_x_reports_every_volume_once(server: Server) -> None:
    make_volume(server, "all")
    output = reqcrypt(server, "iostat").stdout.decode().splitlines()
    assert output[0].split() == [
        "Device",
        "tps",
        "kB_read/s",
        "kB_wrtn/s",
        "kB_dscd/s",
        "kB_read",
        "kB_wrtn",
        "kB_dscd",
    ]
    assert "all" in [line.split()[0] for line in output[1:] if line]


def test_engines_lists_the_models(server: Server) -> None:
    lines = reqcrypt(server, "engines").stdout.decode().splitlines()
    assert lines[0].split()[:2] == ["NAME", "BULK"]
    assert {line.split()[0] for line in lines[1:]} >= {"software", "mv-cesa"}


def test_bench_http_finds_the_service_and_token_the_same_way(server: Server) -> None:
    make_volume(server, "bh")
    result = reqcrypt(server, "bench", "http", "--volume", "bh", "--size", "256k", "--bs", "64k")
    assert "4 I/Os" in result.stdout.decode()


def test_shell_completion_completes_commands() -> None:
    result = subprocess.run(
        [REQCRYPT],
        env={
            **os.environ,
            "_REQCRYPT_COMPLETE": "complete_bash",
            "COMP_WORDS": "reqcrypt io ",
            "COMP_CWORD": "2",
        },
        capture_output=True,
        text=True,
        check=True,
    )
    assert set(result.stdout.split()) == {"read", "write"}
    script = subprocess.run(
        [REQCRYPT, "--show-completion", "bash"], capture_output=True, text=True, check=True
    )
    assert "_REQCRYPT_COMPLETE=complete_bash" in script.stdout


def _trace_while_writing(server: Server, name: str, *options: str) -> str:
    # Into a file, not a pipe: a trace longer than the pipe's buffer would block the tracer.
    with tempfile.TemporaryFile() as out:
        tracer = subprocess.Popen(
            [REQCRYPT, "trace", name, "--seconds", "2", *options],
            stdout=out,
            stderr=subprocess.PIPE,
            env=environment(server),
        )
        try:
            with admin(server) as client:
                block = 0
                deadline = time.monotonic() + 60
                while tracer.poll() is None:  # writing for as long as the trace runs
                    assert time.monotonic() < deadline, "reqcrypt trace --seconds 2 did not end"
                    offset = block % 1024 * 8192
                    response = client.put(
                        f"/v1/volumes/{name}/data",
                        content=b"t" * 8192,
                        headers={"Content-Range": f"bytes {offset}-{offset + 8191}/*"},
                    )
                    assert response.status_code == 204
                    block += 1
                    time.sleep(0.02)
            _, err = tracer.communicate(timeout=60)
        finally:
            tracer.kill()
        assert tracer.returncode == 0, err.decode()
        out.seek(0)
        return out.read().decode()


@pytest.mark.slow
def test_trace_prints_blkparse_lines_and_btt_summary(server: Server) -> None:
    make_volume(server, "traced")
    text = _trace_while_writing(server, "traced")
    assert " Q   W " in text
    assert "crypt encrypt" in text
    assert text.splitlines()[-1].startswith("Skips: 0 forward")
    summary = _trace_while_writing(server, "traced", "--summary")
    assert "Q2C" in summary
    assert "Device Merge Information" in summary
