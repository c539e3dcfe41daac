"""A bounded soak of a running service: many clients, mixed I/O and lifecycle, then a full check.

Each client owns every ``clients``-th 4 KiB block of every volume, so the
content each block must end with is known without coordination. Clients mix
single writes (some unaligned, inside their block), batched writes
(multipart/byteranges), reads checked against what they last wrote, multi-range
reads, flushes; one client suspends and resumes a volume now and then, so I/O
meets a suspended volume (a 503 is then allowed, no other error status is). At
the end every block is read back and compared, and the service's resident memory
after warm-up is compared with the memory at the end.

Loopback only: the load stays on this machine.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import os
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from app.errors import InvalidInput

BLOCK = 4096
KEEPALIVE_EXPIRY_S = 1.0
"""A client drops an idle connection well before the server may (REQCRYPT_KEEP_ALIVE_SECONDS,
5 s by default): at the same expiry the server's close races the client's next request on
it, which then fails with a read error though nothing went wrong."""
BOUNDARY = "reqcrypt-soak"
LIFECYCLE_EVERY_S = 0.5


@dataclass
class SoakReport:
    ops: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    latencies_ms: dict[str, list[float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    blocks_checked: int = 0
    elapsed_s: float = 0.0
    rss_after_warmup: int | None = None
    rss_end: int | None = None

    def record(self, op: str, status: int, began: float) -> None:
        self.ops[op] += 1
        self.statuses[status] += 1
        self.latencies_ms.setdefault(op, []).append((time.perf_counter() - began) * 1e3)

    @property
    def rss_growth(self) -> float | None:
        if not self.rss_after_warmup or self.rss_end is None:
            return None
        return self.rss_end / self.rss_after_warmup - 1

    def percentile_ms(self, op: str, pct: float) -> float:
        values = sorted(self.latencies_ms.get(op, []))
        if not values:
            return 0.0
        return values[min(len(values) - 1, round(pct / 100 * (len(values) - 1)))]

    def lines(self) -> list[str]:
        total = sum(self.ops.values())
        out = [
            f"{total} requests in {self.elapsed_s:.1f} s ({total / max(self.elapsed_s, 1e-9):.0f}/s), "
            f"{self.blocks_checked} blocks verified",
            "statuses: " + ", ".join(f"{s}: {n}" for s, n in sorted(self.statuses.items())),
        ]
        for op in sorted(self.ops):
            out.append(
                f"  {op:14} {self.ops[op]:7} ops  p50 {self.percentile_ms(op, 50):8.2f} ms  "
                f"p99 {self.percentile_ms(op, 99):8.2f} ms"
            )
        if self.rss_growth is not None:
            out.append(
                f"server RSS {self.rss_after_warmup} -> {self.rss_end} bytes "
                f"({self.rss_growth:+.1%} after warm-up)"
            )
        out += [f"FAILED: {failure}" for failure in self.failures[:20]]
        return out


def check_loopback(url: str) -> None:
    host = urlsplit(url).hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise InvalidInput(f"the soak only targets loopback addresses, not {host!r}")


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def _content_range(first: int, length: int) -> str:
    return f"bytes {first}-{first + length - 1}/*"


class _Soak:
    def __init__(
        self, client: httpx.AsyncClient, volumes: list[str], size: int, clients: int, seed: int
    ) -> None:
        self.client = client
        self.volumes = volumes
        self.blocks = size // BLOCK
        self.clients = clients
        self.seed = seed
        self.report = SoakReport()
        # (volume, block) -> digest of the content it must hold; None: never written.
        self.expected: dict[tuple[str, int], bytes] = {}

    def owned(self, index: int) -> list[int]:
        return list(range(index, self.blocks, self.clients))

    async def _call(self, op: str, method: str, path: str, **kwargs: object) -> httpx.Response:
        began = time.perf_counter()
        response = await self.client.request(method, path, **kwargs)  # type: ignore[arg-type]
        self.report.record(op, response.status_code, began)
        if response.status_code >= 400 and response.status_code != 503:
            self.report.failures.append(
                f"{op} {path}: {response.status_code} {response.text[:200]}"
            )
        return response

    async def _put(self, op: str, volume: str, body: bytes, headers: dict[str, str]) -> bool:
        """PUT ``body`` to ``volume``'s data; True when it was written (204)."""
        response = await self._call(
            op, "PUT", f"/v1/volumes/{volume}/data", content=body, headers=headers
        )
        return response.status_code == 204

    async def _block(self, volume: str, block: int) -> bytes | None:
        first = block * BLOCK
        response = await self._call(
            "read",
            "GET",
            f"/v1/volumes/{volume}/data",
            headers={"Range": f"bytes={first}-{first + BLOCK - 1}"},
        )
        return response.content if response.status_code == 206 else None

    async def _write_block(self, volume: str, block: int, rng: random.Random) -> None:
        first = block * BLOCK
        key = (volume, block)
        if key in self.expected and rng.random() < 0.3:
            current = await self._block(volume, block)
            if current is None:
                return
            offset = rng.randrange(BLOCK - 100)
            piece = rng.randbytes(rng.randrange(1, 100))
            headers = {"Content-Range": _content_range(first + offset, len(piece))}
            if await self._put("write-partial", volume, piece, headers):
                self.expected[key] = _digest(
                    current[:offset] + piece + current[offset + len(piece) :]
                )
            return
        data = rng.randbytes(BLOCK)
        if await self._put("write", volume, data, {"Content-Range": _content_range(first, BLOCK)}):
            self.expected[key] = _digest(data)

    async def _write_batch(self, volume: str, blocks: list[int], rng: random.Random) -> None:
        parts = [(block, rng.randbytes(BLOCK)) for block in blocks]
        body = (
            b"".join(
                f"--{BOUNDARY}\r\nContent-Range: {_content_range(b * BLOCK, BLOCK)}\r\n\r\n".encode()
                + data
                + b"\r\n"
                for b, data in parts
            )
            + f"--{BOUNDARY}--\r\n".encode()
        )
        multipart = {"Content-Type": f"multipart/byteranges; boundary={BOUNDARY}"}
        if await self._put("write-batch", volume, body, multipart):
            for block, data in parts:
                self.expected[(volume, block)] = _digest(data)

    async def _verify(self, volume: str, block: int) -> None:
        want = self.expected.get((volume, block))
        if want is None:
            return
        content = await self._block(volume, block)
        if content is not None and _digest(content) != want:
            self.report.failures.append(
                f"{volume} block {block}: read back other bytes than written"
            )

    async def _read_ranges(self, volume: str, blocks: list[int]) -> None:
        spec = ",".join(f"{b * BLOCK}-{b * BLOCK + BLOCK - 1}" for b in blocks)
        await self._call(
            "read-ranges", "GET", f"/v1/volumes/{volume}/data", headers={"Range": f"bytes={spec}"}
        )

    async def client_loop(self, index: int, deadline: float) -> None:
        try:
            await self._client_loop(index, deadline)
        except httpx.HTTPError as error:  # the service dropped or stalled a request
            self.report.failures.append(f"client {index}: {type(error).__name__}: {error}")

    async def _client_loop(self, index: int, deadline: float) -> None:
        rng = random.Random(f"{self.seed}/{index}")
        mine = self.owned(index)
        while time.monotonic() < deadline and mine:
            volume = rng.choice(self.volumes)
            choice = rng.random()
            if choice < 0.45:
                await self._write_block(volume, rng.choice(mine), rng)
            elif choice < 0.55:
                await self._write_batch(volume, rng.sample(mine, min(len(mine), 8)), rng)
            elif choice < 0.85:
                await self._verify(volume, rng.choice(mine))
            elif choice < 0.95:
                await self._read_ranges(volume, rng.sample(mine, min(len(mine), 8)))
            else:
                await self._call("flush", "POST", f"/v1/volumes/{volume}/flush")

    async def lifecycle_loop(self, deadline: float) -> None:
        rng = random.Random(f"{self.seed}/lifecycle")
        while time.monotonic() < deadline:
            await asyncio.sleep(LIFECYCLE_EVERY_S)
            volume = rng.choice(self.volumes)
            await self._call("suspend", "POST", f"/v1/volumes/{volume}/suspend", json={})
            await asyncio.sleep(0.02)
            await self._call("resume", "POST", f"/v1/volumes/{volume}/resume", json={})

    async def final_check(self) -> None:
        for (volume, block), want in sorted(self.expected.items()):
            first = block * BLOCK
            response = await self.client.get(
                f"/v1/volumes/{volume}/data",
                headers={"Range": f"bytes={first}-{first + BLOCK - 1}"},
            )
            if response.status_code != 206 or _digest(response.content) != want:
                self.report.failures.append(f"{volume} block {block}: lost or changed at the end")
            self.report.blocks_checked += 1


async def _rss(client: httpx.AsyncClient) -> int | None:
    response = await client.get("/metrics")
    match = re.search(r"^process_resident_memory_bytes ([0-9.e+]+)$", response.text, re.MULTILINE)
    return int(float(match[1])) if match else None


async def soak(
    url: str,
    token: str | None,
    *,
    clients: int = 64,
    duration_s: float = 60.0,
    volumes: int = 3,
    size: int = 16 << 20,
    seed: int = 0,
) -> SoakReport:
    """Create ``volumes`` volumes, run ``clients`` clients for ``duration_s``, check, clean up."""
    check_loopback(url)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    limits = httpx.Limits(
        max_connections=clients + 2,
        max_keepalive_connections=clients + 2,
        keepalive_expiry=KEEPALIVE_EXPIRY_S,
    )
    tag = os.urandom(3).hex()
    names = [f"soak-{tag}-{i}" for i in range(volumes)]
    ciphers = ["aes-xts-plain64", "aes-cbc-essiv:sha256", "aes-xts-plain64"]
    async with httpx.AsyncClient(
        base_url=url, headers=headers, limits=limits, timeout=120
    ) as client:
        created: list[str] = []
        try:
            for i, name in enumerate(names):
                response = await client.post("/v1/devices", json={"name": name, "size_bytes": size})
                response.raise_for_status()
                created.append(name)
                cipher = ciphers[i % len(ciphers)]
                key = os.urandom(64 if "xts" in cipher else 32).hex()
                table = f"0 {size // 512} crypt {cipher} {key} 0 {name} 0"
                response = await client.post(
                    "/v1/volumes",
                    json={"name": name, "table": table, "dispatch_mode": ["bio", "request"][i % 2]},
                )
                response.raise_for_status()
            run = _Soak(client, names, size, clients, seed)
            started = time.monotonic()
            deadline = started + duration_s
            warmup = asyncio.create_task(asyncio.sleep(min(duration_s * 0.2, 10)))
            tasks = [asyncio.create_task(run.client_loop(i, deadline)) for i in range(clients)]
            tasks.append(asyncio.create_task(run.lifecycle_loop(deadline)))
            await warmup
            run.report.rss_after_warmup = await _rss(client)
            await asyncio.gather(*tasks)
            run.report.elapsed_s = time.monotonic() - started
            run.report.rss_end = await _rss(client)
            await run.final_check()
            return run.report
        finally:
            for name in created:
                await client.post(f"/v1/volumes/{name}/resume", json={})
                await client.delete(f"/v1/volumes/{name}")
                await client.delete(f"/v1/devices/{name}")
