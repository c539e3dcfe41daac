"""``reqcrypt luks`` against a real uvicorn: key files, and a prompt that does not echo."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.app import ADMIN_TOKEN
from tests.support.servers import Server

pytestmark = pytest.mark.e2e
REQCRYPT = str(Path(sys.executable).with_name("reqcrypt"))
CHEAP = ["--pbkdf", "argon2id", "--pbkdf-memory", "32768", "--pbkdf-force-iterations", "4",
         "--pbkdf-parallel", "1"]  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("luks") / "data")
    running.start()
    try:
        httpx.post(
            f"{running.base}/v1/devices",
            json={"name": "sdb", "size_bytes": 32 << 20},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        ).raise_for_status()
        yield running
    finally:
        running.stop()


def environment(server: Server) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REQCRYPT_")}
    return {**clean, "REQCRYPT_URL": server.base, "REQCRYPT_TOKEN": ADMIN_TOKEN}


def reqcrypt(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [REQCRYPT, "luks", *args],
        capture_output=True,
        text=True,
        env=environment(server),
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result


def on_terminal(server: Server, args: list[str], answers: list[bytes]) -> tuple[int, bytes]:
    """Run with a pseudo-terminal as the controlling terminal (what getpass reads), typing
    each answer after a prompt; the exit status and everything the terminal showed."""
    leader, follower = pty.openpty()

    def take_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    process = subprocess.Popen(
        [REQCRYPT, "luks", *args],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=environment(server),
        preexec_fn=take_terminal,
    )
    os.close(follower)
    shown = b""
    pending = list(answers)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            data = os.read(leader, 4096)
        except OSError:  # the terminal's other end closed
            break
        if not data:
            break
        shown += data
        # getpass writes the prompt's last space once echo is off: answer only then
        if pending and shown.endswith(b": "):
            os.write(leader, pending.pop(0) + b"\n")
            shown += b"\x00"  # mark the answer, so the same prompt is not answered twice
    os.close(leader)
    return process.wait(timeout=60), shown


@pytest.mark.slow
def test_format_prompts_without_echo_and_cryptsetup_opens_the_image(
    server: Server, tmp_path: Path
) -> None:
    code, shown = on_terminal(
        server, ["format", "sdb", "--label", "cli", *CHEAP], [b"s3cret-phrase", b"s3cret-phrase"]
    )
    assert code == 0, shown
    assert b"s3cret-phrase" not in shown
    assert b"Label:        cli" in shown

    dump = json.loads(reqcrypt(server, "dump", "sdb", "--json").stdout)
    assert (dump["version"], dump["keyslots"][0]["pbkdf"]["type"]) == (2, "argon2id")

    new = tmp_path / "new.key"
    new.write_text("second")
    old = tmp_path / "old.key"
    old.write_text("s3cret-phrase")
    added = reqcrypt(server, "add-key", "sdb", str(new), "--key-file", str(old), *CHEAP)
    assert added.stdout.strip() == "Key slot 1 created."
    reqcrypt(server, "kill-slot", "sdb", "0", "--key-file", str(new))
    reqcrypt(server, "open", "sdb", "clear", "--key-file", str(new))

    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    table = httpx.get(f"{server.base}/v1/volumes/clear/table", headers=headers).text
    assert table.startswith("0 32768 crypt aes-xts-plain64 " + "0" * 128 + " 0 sdb 32768")
    httpx.delete(f"{server.base}/v1/volumes/clear", headers=headers).raise_for_status()
    image = httpx.get(
        f"{server.base}/v1/devices/sdb/luks", headers=headers
    )  # still a valid header after the kill
    assert [slot["slot"] for slot in image.json()["keyslots"]] == [1]


def test_a_wrong_passphrase_exits_non_zero_with_the_problem(server: Server, tmp_path: Path) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    device = {"name": "sdc", "size_bytes": 32 << 20}
    httpx.post(f"{server.base}/v1/devices", json=device, headers=headers).raise_for_status()
    right = tmp_path / "right.key"
    right.write_bytes(b"\x00\x01binary")
    reqcrypt(server, "format", "sdc", "--key-file", str(right), *CHEAP)
    wrong = tmp_path / "wrong.key"
    wrong.write_text("nope")
    result = subprocess.run(
        [REQCRYPT, "luks", "open", "sdc", "x", "--key-file", str(wrong)],
        capture_output=True,
        text=True,
        env=environment(server),
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    assert "403 no keyslot opens with this passphrase" in result.stderr


def test_iter_time_times_the_new_keyslots(server: Server, tmp_path: Path) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    device = {"name": "sdd", "size_bytes": 32 << 20}
    httpx.post(f"{server.base}/v1/devices", json=device, headers=headers).raise_for_status()
    key = tmp_path / "k.key"
    key.write_text("first")
    new = tmp_path / "new.key"
    new.write_text("second")
    reqcrypt(server, "format", "sdd", "--key-file", str(key), "--pbkdf", "pbkdf2",
             "--iter-time", "20")  # fmt: skip
    reqcrypt(server, "add-key", "sdd", str(new), "--key-file", str(key), "--pbkdf", "argon2id",
             "--pbkdf-memory", "8192", "--pbkdf-parallel", "1", "-i", "30")  # fmt: skip
    slots = json.loads(reqcrypt(server, "dump", "sdd", "--json").stdout)["keyslots"]
    assert 1000 < slots[0]["pbkdf"]["iterations"] < 1_000_000
    assert slots[1]["pbkdf"]["memory_kib"] == 8192
    assert slots[1]["pbkdf"]["iterations"] >= 4
