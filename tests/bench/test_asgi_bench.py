"""The 4 KiB write's cost inside the app, without a server (run with -m bench -s).

wrk figures on a 2-core machine swing by a third between runs; CPU time of the
thread that calls the ASGI app swings less. One 4 KiB PUT at a time, plain
asyncio, plug window 0, the cases interleaved round by round (a minimum per case,
taken one case after the other, gave bounds from 32 to 68 % in one session as
the machine's speed drifted), for: the bare endpoint, the bare
endpoint plus its worker round trip, an xts volume as served, and the same
volume with its I/O called inline on the loop (an experiment, never how the
service runs). The last gives the bound the HTTP benchmark's 4 KiB target must
fit under: with a free round trip and a perfectly shared GIL, xts still cannot
pass ``null / inline xts`` of the ceiling.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

import pytest
from fastapi import FastAPI

from app.api.executor import IoExecutor
from app.config import Settings
from app.main import create_app
from tests.conftest import ADMIN_TOKEN, asgi_client

pytestmark = [pytest.mark.bench, pytest.mark.anyio]
KIB4 = 4096
VOLUME_BYTES = 64 << 20
REQUESTS = 1500
ROUNDS = 7
TARGET = 0.60  # the HTTP benchmark's 4 KiB share of the ceiling


def put_scope(path: str, query: str, offset: int) -> dict[str, Any]:
    headers = {
        "authorization": f"Bearer {ADMIN_TOKEN}",
        "content-range": f"bytes {offset}-{offset + KIB4 - 1}/*",
        "content-length": str(KIB4),
    }
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "PUT",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(key.encode(), value.encode()) for key, value in headers.items()],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
        "state": {},
    }


async def put(app: FastAPI, scope: dict[str, Any], body: bytes) -> int:
    messages: list[dict[str, Any]] = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # the client never disconnects
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status: int = sent[0]["status"]
    return status


async def measure(app: FastAPI, path: str, query: str) -> tuple[float, float]:
    """(wall, calling thread CPU) per request in µs over one batch of requests."""
    body = bytes(KIB4)
    began, began_cpu = time.perf_counter(), time.thread_time()
    for index in range(REQUESTS):
        scope = put_scope(path, query, index % (VOLUME_BYTES // KIB4) * KIB4)
        assert await put(app, scope, body) == 204
    wall = (time.perf_counter() - began) / REQUESTS * 1e6
    return wall, (time.thread_time() - began_cpu) / REQUESTS * 1e6


async def run_inline(self: IoExecutor, func: Callable[..., Any], *args: Any) -> Any:
    return func(*args)


async def test_a_4k_xts_write_leaves_the_loop_room_for_the_http_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(
        data_dir=tmp_path,
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
        plug_window_us=0,
        log_level="warning",
        bench_ceiling=True,
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app), asgi_client(app, ADMIN_TOKEN) as client:
        await client.post("/v1/devices", json={"name": "pv", "size_bytes": VOLUME_BYTES})
        key = bytes(range(64)).hex()
        table = f"0 {VOLUME_BYTES // 512} crypt aes-xts-plain64 {key} 0 pv 0"
        assert (await client.post("/v1/volumes", json={"name": "xts", "table": table})).is_success
        cases = {
            "null": ("/v1/null/data", ""),
            "null+thread": ("/v1/null/data", "thread=true"),
            "xts": ("/v1/volumes/xts/data", ""),
        }
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in [*cases, "inline"]}
        for _ in range(ROUNDS):
            for name, where in cases.items():
                results[name].append(await measure(app, *where))
            with monkeypatch.context() as patch:
                patch.setattr(IoExecutor, "run", run_inline)
                results["inline"].append(await measure(app, *cases["xts"]))
    print()
    print(f"{'4 KiB PUT':12} {'wall µs':>9} {'loop CPU µs':>12}  (medians of {ROUNDS} rounds)")
    for name, runs in results.items():
        label = "xts inline" if name == "inline" else name
        print(f"{label:12} {median(w for w, _ in runs):9.1f} {median(c for _, c in runs):12.1f}")
    bounds = sorted(
        null[1] / inline[1] for null, inline in zip(results["null"], results["inline"], strict=True)
    )
    bound = median(bounds)
    print(
        f"bound on xts / ceiling with a free round trip: {bound:.0%} "
        f"({bounds[0]:.0%}-{bounds[-1]:.0%} by round; target {TARGET:.0%})"
    )
    assert bound >= TARGET
