"""No key leaves a real ``reqcrypt serve`` except in a ``show_keys`` answer to the admin.

A full run (several ciphers, data I/O, table loads, key messages, refused tables that
carry a key, 4xx and 5xx answers, and an unexpected exception whose message echoes
a key) is recorded whole: every line the server printed, every response's status
line, headers and body. Each key is looked for in hex (both cases, and every 16-byte
window, so a truncated echo counts) and in base64.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.app import ADMIN_TOKEN, IO_TOKEN
from tests.support.ports import free_port, wait_ready

pytestmark = pytest.mark.e2e

# A bug stand-in: a schema-valid message naming the key in EXPLODE_ON fails the way int()
# does, echoing its input (the key) into the exception.
FAULTY_SERVE = textwrap.dedent(
    """
    import os
    import sys
    import app.control
    from app.cli import main

    original = app.control.Control.message

    def message(self, name, text, sector=0):
        if os.environ["EXPLODE_ON"] in text:
            int(text)
        return original(self, name, text, sector)

    app.control.Control.message = message
    sys.argv = ["reqcrypt", "serve"]
    main()
    """
)


def new_key(size: int) -> str:
    return os.urandom(size).hex()


KEYS = {
    "xts": new_key(64),
    "essiv": new_key(32),
    "capi": new_key(32),
    "ecb": new_key(16),
    "xts4k": new_key(64),
    "reload": new_key(64),
    "key_set": new_key(64),
    "bad_length": new_key(63),
    "bad_cipher": new_key(64),
    "bad_device": new_key(64),
    "bad_option": new_key(64),
    "not_hex": new_key(64),
    "bad_create": new_key(33),
    "malformed_json": new_key(64),
    "validation": new_key(32),
    "short_set": new_key(31),
    "active_set": new_key(64),
    "exploding": new_key(64),
}


def forms(key_hex: str) -> list[str]:
    """The key as it could leak: whole and 16-byte windows in hex of either case, base64."""
    raw = bytes.fromhex(key_hex)
    found = [key_hex[i : i + 32] for i in range(0, len(key_hex) - 31, 2)]
    found += [window.upper() for window in found]
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        text = encode(raw).decode()
        found += [text, text.rstrip("=")]
    return found


def leaks(text: str) -> list[str]:
    return [name for name, key in KEYS.items() if any(form in text for form in forms(key))]


class RecordingServer:
    def __init__(self, data_dir: Path, log_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.stdout = log_dir / "stdout.log"
        self.stderr = log_dir / "stderr.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {
            **os.environ,
            "REQCRYPT_DATA_DIR": str(self.data_dir),
            "REQCRYPT_ADMIN_TOKEN": ADMIN_TOKEN,
            "REQCRYPT_IO_TOKEN": IO_TOKEN,
            "REQCRYPT_PORT": str(self.port),
            "REQCRYPT_LOG_LEVEL": "debug",
            "REQCRYPT_SUSPEND_WAIT_SECONDS": "1",
            "EXPLODE_ON": KEYS["exploding"],
        }
        with self.stdout.open("wb") as out, self.stderr.open("wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-c", FAULTY_SERVE], env=env, stdout=out, stderr=err
            )
        wait_ready(f"{self.base}/readyz", self.process)

    def stop(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=15)
            self.process = None

    def logs(self) -> str:
        return self.stdout.read_text(errors="replace") + self.stderr.read_text(errors="replace")


class Recorder:
    """httpx event hook: every response, whole, tagged with whether it is a show_keys answer."""

    def __init__(self) -> None:
        self.seen: list[tuple[bool, str]] = []

    def __call__(self, response: httpx.Response) -> None:
        response.read()
        request = response.request
        shown = request.url.params.get("show_keys") == "true"
        headers = "".join(f"{k}: {v}\n" for k, v in response.headers.items())
        head = f"{request.method} {request.url} -> {response.status_code}\n{headers}"
        self.seen.append((shown, head + response.content.decode("latin-1")))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RecordingServer]:
    running = RecordingServer(tmp_path / "data", tmp_path)
    running.start()
    try:
        yield running
    finally:
        running.stop()


def crypt(cipher: str, key: str, device: str = "pv", offset: int = 0, extra: str = "") -> str:
    return f"0 2048 crypt {cipher} {key} 0 {device} {offset}{extra}"


def scenario(admin: httpx.Client, io: httpx.Client) -> dict[str, int]:
    """Everything a user might do, good and bad; returns the status of each named step."""
    status: dict[str, int] = {}

    def step(name: str, response: httpx.Response) -> None:
        status[name] = response.status_code

    step("device", admin.post("/v1/devices", json={"name": "pv", "size_bytes": 16 << 20}))
    tables = {
        "xts": crypt("aes-xts-plain64", KEYS["xts"], offset=0),
        "essiv": crypt("aes-cbc-essiv:sha256", KEYS["essiv"], offset=2048),
        "capi": crypt("capi:cbc(aes)-plain64", KEYS["capi"], offset=4096),
        "ecb": crypt("aes-ecb", KEYS["ecb"], offset=6144),
        "xts4k": crypt("aes-xts-plain64", KEYS["xts4k"], offset=8192, extra=" 1 sector_size:4096"),
    }
    for name, table in tables.items():
        step(f"create {name}", admin.post("/v1/volumes", json={"name": name, "table": table}))
        payload = os.urandom(8192)
        put = io.put(
            f"/v1/volumes/{name}/data", content=payload, headers={"Content-Range": "bytes 0-8191/*"}
        )
        step(f"write {name}", put)
        got = io.get(f"/v1/volumes/{name}/data", headers={"Range": "bytes=0-8191"})
        assert got.content == payload
        step(f"read {name}", got)
        step(f"info {name}", io.get(f"/v1/volumes/{name}"))
        step(f"status {name}", io.get(f"/v1/volumes/{name}/status"))
        step(f"table {name}", io.get(f"/v1/volumes/{name}/table"))
        step(
            f"show_keys {name}",
            admin.get(f"/v1/volumes/{name}/table", params={"show_keys": "true"}),
        )
        step(
            f"io show_keys {name}",
            io.get(f"/v1/volumes/{name}/table", params={"show_keys": "true"}),
        )
    step("list", admin.get("/v1/volumes"))
    step("416", io.get("/v1/volumes/xts/data", headers={"Range": "bytes=999999999-1000000000"}))
    step("metrics", admin.get("/metrics"))

    reload = crypt("aes-xts-plain64", KEYS["reload"])
    step(
        "load",
        admin.put("/v1/volumes/xts/table", content=reload, headers={"Content-Type": "text/plain"}),
    )
    step("inactive", admin.get("/v1/volumes/xts/table", params={"inactive": "true"}))
    step("io load", io.put("/v1/volumes/xts/table", json={"table": reload}))
    step("resume", admin.post("/v1/volumes/xts/resume"))
    bad_tables = {
        "bad_length": crypt("aes-xts-plain64", KEYS["bad_length"]),
        "bad_cipher": crypt("aes-nosuch-plain64", KEYS["bad_cipher"]),
        "bad_device": crypt("aes-xts-plain64", KEYS["bad_device"], device="nosuch"),
        "bad_option": crypt("aes-xts-plain64", KEYS["bad_option"], extra=" 1 no_such_option"),
        "not_hex": crypt("aes-xts-plain64", KEYS["not_hex"][:-1] + "z"),
        "two lines": crypt("aes-xts-plain64", KEYS["bad_option"])
        + "\n"
        + crypt("aes-xts-plain64", KEYS["bad_cipher"]),
    }
    for name, table in bad_tables.items():
        step(f"load {name}", admin.put("/v1/volumes/essiv/table", json={"table": table}))
        step(
            f"text load {name}",
            admin.put(
                "/v1/volumes/essiv/table", content=table, headers={"Content-Type": "text/plain"}
            ),
        )
    step(
        "create bad",
        admin.post(
            "/v1/volumes",
            json={"name": "bad", "table": crypt("aes-xts-plain64", KEYS["bad_create"])},
        ),
    )
    step(
        "malformed json",
        admin.put(
            "/v1/volumes/essiv/table",
            content='{"table": "' + crypt("aes-xts-plain64", KEYS["malformed_json"]),
            headers={"Content-Type": "application/json"},
        ),
    )
    step(
        "validation",
        admin.post(
            "/v1/volumes", json={"name": "v", "table": 7, "dispatch_mode": KEYS["validation"]}
        ),
    )

    step(
        "active key set",
        admin.post("/v1/volumes/essiv/message", json={"message": f"key set {KEYS['active_set']}"}),
    )
    step("suspend", admin.post("/v1/volumes/essiv/suspend"))
    step(
        "short key set",
        admin.post("/v1/volumes/essiv/message", json={"message": f"key set {KEYS['short_set']}"}),
    )
    step("key wipe", admin.post("/v1/volumes/essiv/message", json={"message": "key wipe"}))
    step("resume wiped", admin.post("/v1/volumes/essiv/resume"))
    step("read suspended", io.get("/v1/volumes/essiv/data", headers={"Range": "bytes=0-511"}))
    step("suspend xts", admin.post("/v1/volumes/xts/suspend"))
    step(
        "key set",
        admin.post("/v1/volumes/xts/message", json={"message": f"key set {KEYS['key_set']}"}),
    )
    step(
        "explode",
        admin.post(
            "/v1/volumes/xts/message",
            json={"message": f"key set {KEYS['exploding']}"},
            headers={"Connection": "close"},  # uvicorn drops it after an exception reaches it
        ),
    )
    step("resume xts", admin.post("/v1/volumes/xts/resume"))
    step("show new key", admin.get("/v1/volumes/xts/table", params={"show_keys": "true"}))

    step(
        "error volume", admin.post("/v1/volumes", json={"name": "broken", "table": "0 2048 error"})
    )
    step("read error", io.get("/v1/volumes/broken/data", headers={"Range": "bytes=0-511"}))
    step(
        "write error",
        io.put(
            "/v1/volumes/broken/data",
            content=bytes(512),
            headers={"Content-Range": "bytes 0-511/*"},
        ),
    )
    step("no token", httpx.get(f"{admin.base_url}/v1/volumes/xts/table"))
    step("remove", admin.delete("/v1/volumes/ecb"))
    return status


def test_no_key_reaches_a_log_or_a_response_except_show_keys_to_the_admin(
    server: RecordingServer,
) -> None:
    recorder = Recorder()
    hooks = {"response": [recorder]}
    with (
        httpx.Client(
            base_url=server.base,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            event_hooks=hooks,
            timeout=60,
        ) as admin,
        httpx.Client(
            base_url=server.base,
            headers={"Authorization": f"Bearer {IO_TOKEN}"},
            event_hooks=hooks,
            timeout=60,
        ) as io,
    ):
        status = scenario(admin, io)
    server.stop()

    # The run reached what it claims to: successes, refusals, server errors.
    assert status["show_keys xts"] == 200
    assert status["io show_keys xts"] == 403
    assert status["load"] == 204
    for name in ("bad_length", "bad_cipher", "bad_device", "bad_option", "not_hex", "two lines"):
        assert status[f"load {name}"] == 422, name
        assert status[f"text load {name}"] == 422, name
    assert status["create bad"] == 422
    assert status["malformed json"] == 400
    assert status["validation"] == 422
    assert status["active key set"] == 409
    assert status["short key set"] == 422
    assert status["key set"] == 204
    assert status["explode"] == 500
    assert status["read error"] >= 500
    assert status["no token"] == 401
    logs = server.logs()
    assert "Exception in ASGI application" in logs or "unhandled error" in logs
    assert "ValueError" in logs  # the unexpected exception is logged, its message is not

    shown = [text for admin_shown, text in recorder.seen if admin_shown and "-> 200" in text]
    assert set(leaks("".join(shown))) == {"xts", "essiv", "capi", "ecb", "xts4k", "key_set"}

    for admin_shown, text in recorder.seen:
        if not (admin_shown and "-> 200" in text):
            assert not leaks(text), text
    assert not leaks(logs), [line for line in logs.splitlines() if leaks(line)]
