"""Run a ``Workload`` against a target from ``iodepth x numjobs`` threads.

In-process the target is a ``Volume`` (the exact data path the HTTP routes
call, minus HTTP); ``HttpTarget`` does the same over the service's ranged
``/v1/volumes/{name}/data`` API with one keep-alive connection per thread.
``batch=True`` is fio's iodepth_batch over HTTP: one thread per job hands its
``iodepth`` I/Os to the service as one batched request (a multi-range GET, a
multipart/byteranges PUT), each I/O's latency being its batch's.
Every figure here is *measured* on this host: wall time, per-I/O latency and
the process's CPU (user + sys of every thread, ``time.process_time``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import httpx

from app.bench.workload import IoUnit, Workload, job_ios
from app.errors import InvalidInput

Progress = Callable[[int], None]


class IoTarget(Protocol):
    """What a workload needs: ranged read, write and flush (``Volume`` has them)."""

    def read(self, offset: int, length: int) -> bytes | bytearray: ...
    def write(self, offset: int, data: bytes) -> object: ...
    def flush(self) -> None: ...


class BatchTarget(IoTarget, Protocol):
    """A target that takes several I/Os in one submission."""

    def read_batch(self, ranges: Sequence[tuple[int, int]]) -> None: ...
    def write_batch(self, writes: Sequence[tuple[int, bytes]]) -> None: ...


@dataclass(frozen=True, slots=True)
class RunResult:
    """Measured outcome of one run; latencies are per I/O, in ns, sorted."""

    bytes_read: int
    bytes_written: int
    ios: int
    elapsed_s: float
    cpu_s: float | None
    latencies_ns: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def mb_s(self) -> float:
        """Decimal MB/s, as dd and fio print it."""
        return self.nbytes / self.elapsed_s / 1e6 if self.elapsed_s > 0 else 0.0

    @property
    def iops(self) -> float:
        return self.ios / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def percentile_ms(self, pct: float) -> float:
        if not self.latencies_ns:
            return 0.0
        index = min(len(self.latencies_ns) - 1, round(pct / 100 * (len(self.latencies_ns) - 1)))
        return self.latencies_ns[index] / 1e6


class _Job:
    """One fio job: a shared iterator its ``iodepth`` threads pull from (I/Os in flight)."""

    def __init__(self, workload: Workload, job: int) -> None:
        self.workload = workload
        self.job = job
        self._lock = threading.Lock()
        self._ios: Iterator[IoUnit] = job_ios(workload, job)
        self._deadline = (
            time.monotonic() + workload.runtime if workload.runtime is not None else None
        )

    def next(self) -> IoUnit | None:
        with self._lock:
            if self._deadline is not None and time.monotonic() >= self._deadline:
                return None
            io = next(self._ios, None)
            if io is None and self._deadline is not None:
                self._ios = job_ios(self.workload, self.job)  # time_based: loop the region
                io = next(self._ios, None)
            return io


def run_workload(
    target: IoTarget,
    workload: Workload,
    *,
    progress: Progress | None = None,
    measure_cpu: bool = True,
    batch: bool = False,
) -> RunResult:
    """Run ``workload`` on ``target``; ``progress(nbytes)`` is called after each I/O."""
    workload.validate()
    payload = os.urandom(workload.bs)  # incompressible, like fio's default buffers
    jobs = [_Job(workload, job) for job in range(workload.numjobs)]
    latencies: list[list[int]] = []
    totals = {"read": 0, "write": 0}
    lock = threading.Lock()
    errors: list[BaseException] = []

    def submit(ios: list[IoUnit]) -> None:
        if not batch:
            (io,) = ios
            if io.op == "read":
                target.read(io.offset, io.length)
            else:
                target.write(io.offset, payload)
            return
        assert isinstance(target, HttpTarget)
        reads = [(io.offset, io.length) for io in ios if io.op == "read"]
        writes = [(io.offset, payload) for io in ios if io.op == "write"]
        if reads:
            target.read_batch(reads)
        if writes:
            target.write_batch(writes)

    def worker(job: _Job) -> None:
        group = workload.iodepth if batch else 1
        mine: list[int] = []
        done = {"read": 0, "write": 0}
        try:
            while not errors:
                ios: list[IoUnit] = []
                while len(ios) < group and (io := job.next()) is not None:
                    ios.append(io)
                if not ios:
                    break
                began = time.perf_counter_ns()
                submit(ios)
                mine += [time.perf_counter_ns() - began] * len(ios)
                for io in ios:
                    done[io.op] += io.length
                if progress is not None:
                    progress(sum(io.length for io in ios))
        except BaseException as exc:
            errors.append(exc)
        with lock:
            latencies.append(mine)
            totals["read"] += done["read"]
            totals["write"] += done["write"]

    # Batched: one thread per job with iodepth I/Os per request; else iodepth threads per job.
    threads = [
        threading.Thread(target=worker, args=(job,), name=f"bench-job{job.job}-{depth}")
        for job in jobs
        for depth in range(1 if batch else workload.iodepth)
    ]
    cpu_before = time.process_time()
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if not workload.direct and totals["write"]:
        target.flush()
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_before
    if errors:
        raise errors[0]
    merged = sorted(value for part in latencies for value in part)
    return RunResult(
        bytes_read=totals["read"],
        bytes_written=totals["write"],
        ios=len(merged),
        elapsed_s=elapsed,
        cpu_s=cpu if measure_cpu else None,
        latencies_ns=tuple(merged),
    )


class HttpTarget:
    """A volume over the service's HTTP data API (Content-Range PUT, Range GET, bearer token).

    ``httpx.Client`` is thread-safe and pools keep-alive connections; the pool
    is sized to the workload's concurrency so no thread waits for a connection.
    """

    def __init__(
        self,
        base_url: str,
        volume: str,
        *,
        token: str | None,
        concurrency: int = 1,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self.client = httpx.Client(
            base_url=base_url, headers=headers, limits=limits, timeout=60.0, transport=transport
        )
        self.path = f"/v1/volumes/{volume}"

    def read(self, offset: int, length: int) -> bytes:
        response = self.client.get(
            f"{self.path}/data", headers={"Range": f"bytes={offset}-{offset + length - 1}"}
        )
        _check(response, 206)
        return response.content

    def write(self, offset: int, data: bytes) -> None:
        response = self.client.put(
            f"{self.path}/data",
            content=data,
            headers={
                "Content-Range": f"bytes {offset}-{offset + len(data) - 1}/*",
                "Content-Type": "application/octet-stream",
            },
        )
        _check(response, 204)

    def read_batch(self, ranges: Sequence[tuple[int, int]]) -> None:
        """One GET for every range (a multipart/byteranges answer when several)."""
        spec = ",".join(f"{offset}-{offset + length - 1}" for offset, length in ranges)
        response = self.client.get(f"{self.path}/data", headers={"Range": f"bytes={spec}"})
        _check(response, 206)

    def write_batch(self, writes: Sequence[tuple[int, bytes]]) -> None:
        """One multipart/byteranges PUT carrying every write."""
        boundary = "reqcrypt-bench-batch"
        body = bytearray()
        for offset, data in writes:
            body += (
                f"--{boundary}\r\nContent-Range: bytes {offset}-{offset + len(data) - 1}/*\r\n\r\n"
            ).encode()
            body += data
            body += b"\r\n"
        body += f"--{boundary}--\r\n".encode()
        response = self.client.put(
            f"{self.path}/data",
            content=bytes(body),
            headers={"Content-Type": f"multipart/byteranges; boundary={boundary}"},
        )
        _check(response, 204)

    def flush(self) -> None:
        _check(self.client.post(f"{self.path}/flush"), 204)

    def size(self) -> int:
        response = self.client.get(self.path)
        _check(response, 200)
        return int(response.json()["size_bytes"])

    def close(self) -> None:
        self.client.close()


def _check(response: httpx.Response, status: int) -> None:
    if response.status_code != status:
        detail = response.text[:300]
        raise InvalidInput(
            f"{response.request.method} {response.request.url.path}: "
            f"HTTP {response.status_code}: {detail}"
        )
