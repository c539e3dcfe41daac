"""HTTP data path throughput against the HTTP ceiling and against qemu-img, ratios in one run
(run with -m bench).

Sequential 1 MiB and random 4 KiB writes and reads on an aes-xts-plain64 volume,
a linear volume and the bare ``/v1/null/data`` endpoint of the same app (which
accepts and returns the same bytes without touching a volume). The load comes
from wrk (``apt-get install wrk``), a C load generator on keep-alive connections
that sends requests built once (``wrk_ranges.lua``). The server runs on one core and wrk on
the other (``tests/bench/cores.py``); wrk's CPU, from ``/proc/<pid>/stat``, is printed beside
each figure, and a round where it came near a core is flagged, not failed.

The peer: ``qemu-img convert -n`` (Debian qemu-utils) encrypting a 256 MiB raw file
into an existing LUKS image does the same job in C; it runs in the same rounds as
reqcrypt taking the same bytes as 1 MiB PUTs.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import time
from pathlib import Path
from statistics import median

import httpx
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from tests.bench.cores import (
    CORE_CROWDED,
    SERVER_CORE,
    CoreSample,
    busy_clients,
    cpu_seconds,
    crowded_cores,
    pin,
    run_client,
)
from tests.support.app import ADMIN_TOKEN
from tests.support.servers import Server

pytestmark = pytest.mark.bench
MIB = 1 << 20
SIZE = 256 * MIB
SCRIPT = Path(__file__).with_name("wrk_ranges.lua")
DURATION_S = 3
ROUNDS = 3
"""Each workload runs every target ROUNDS times, interleaved; a ratio is taken within a
round (xts next to the ceiling measured a few seconds apart) and the median is kept:
single runs of the ceiling varied 2x on this machine."""
TARGETS = {
    "xts": "/v1/volumes/xts/data",
    "linear": "/v1/volumes/lin/data",
    "null+thread": "/v1/null/data?thread=true",
    "null": "/v1/null/data",
}
WORKLOADS = {  # name: (method, bytes per I/O, pattern, connections, xts's own cost bounded)
    "seq write 1 MiB": ("PUT", MIB, "seq", 4, True),
    "seq read 1 MiB": ("GET", MIB, "seq", 4, True),
    # Single 4 KiB requests have no bound: the framework's per-request cost dominates
    # them (docs/benchmarks.md); batches (test_batch_bench.py) and NBD replace them.
    "rand write 4 KiB": ("PUT", 4096, "rand", 16, False),
    "rand read 4 KiB": ("GET", 4096, "rand", 16, False),
}
OVERHEAD_MS_PER_MIB = 0.6
"""What an xts request may cost per MiB beyond the ceiling's request, one OpenSSL call over
its bytes and one pwrite/pread of them: the block layer's Python, the ciphertext buffer, the
worker hand-off and their copies (about 0.4 ms in the quiet run of docs/benchmarks.md). An
extra out-of-cache copy of the MiB (about 0.35 ms here) or per-unit Python exceeds it."""


class Wrk:
    """One wrk run on the client core: requests per second and wrk's CPU per second of its
    run (wrk -t1 is one thread, saturated at 1.0; sending 1 MiB over loopback costs the sender
    the receiver's TCP work too, so its share grows with the rate)."""

    def __init__(self, url: str, method: str, size: int, pattern: str, connections: int) -> None:
        env = {
            **os.environ,
            "TOKEN": ADMIN_TOKEN,
            "METHOD": method,
            "BS": str(size),
            "SIZE": str(SIZE),
            "PATTERN": pattern,
        }
        command = ["wrk", "-t1", f"-c{connections}", f"-d{DURATION_S}s", "-s", str(SCRIPT), url]
        run = run_client(command, env)
        assert run.returncode == 0, run.stderr
        assert "Non-2xx" not in run.stdout, run.stdout
        rate = re.search(r"Requests/sec:\s+([0-9.]+)", run.stdout)
        assert rate, run.stdout
        self.rate = float(rate[1])
        self.client_cores = run.cores


def prefill(client: httpx.Client, path: str) -> None:
    """Write every byte once before measuring: the first write into a sparse device file
    allocates its blocks (about 2 ms per MiB here), which a disk in steady state does not pay."""
    chunk = bytes(MIB)
    for offset in range(0, SIZE, MIB):
        headers = {"Content-Range": f"bytes {offset}-{offset + MIB - 1}/*"}
        assert client.put(path, content=chunk, headers=headers).status_code == 204


class Cell:
    """One workload on one target, over the rounds: rates and CPU per request."""

    def __init__(self) -> None:
        self.rates: list[float] = []
        self.loop_ms: list[float] = []
        self.workers_ms: list[float] = []
        self.client_cores: list[float] = []
        self.loop_waits: list[float] = []
        """The share of each run the server's loop waited for its core, its own threads' turns
        included (``CoreSample.loop_waited_since``)."""
        self.others: list[float] = []
        """The share of each run its core spent on other work (``CoreSample.others_since``)."""

    def measure(self, pid: int, url: str, method: str, size: int, pattern: str, conns: int) -> None:
        before, core = cpu_seconds(pid), CoreSample.of(pid)
        run = Wrk(url, method, size, pattern, conns)
        after, core_after = cpu_seconds(pid), CoreSample.of(pid)
        self.loop_waits.append(core_after.loop_waited_since(core))
        self.others.append(core_after.others_since(core))
        requests = run.rate * DURATION_S
        self.rates.append(run.rate)
        self.client_cores.append(run.client_cores)
        self.loop_ms.append((after[0] - before[0]) / requests * 1e3)
        self.workers_ms.append((after[1] - before[1]) / requests * 1e3)


def crypto_and_store_ms(path: Path, method: str) -> float:
    """Server-core CPU ms of the work an xts request of 1 MiB cannot avoid: one OpenSSL
    AES-XTS call over the MiB (what the cipher kernel is held to) and one pwrite (PUT) or
    pread (GET) of it on a page-cached file; median of rounds, while the server idles."""
    key, data = bytes(range(64)), os.urandom(MIB)
    out = bytearray(MIB)
    encrypt = method == "PUT"
    path.write_bytes(data)
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {SERVER_CORE})
    fd = os.open(path, os.O_RDWR)
    try:
        rounds = []
        for _ in range(5):
            start = time.thread_time()
            for _ in range(50):
                cipher = Cipher(algorithms.AES(key), modes.XTS(bytes(16)))
                context = cipher.encryptor() if encrypt else cipher.decryptor()
                context.update_into(data, out)
                if encrypt:
                    os.pwrite(fd, out, 0)
                else:
                    os.preadv(fd, [out], 0)
            rounds.append((time.thread_time() - start) / 50 * 1e3)
    finally:
        os.close(fd)
        os.sched_setaffinity(0, affinity)
    return median(rounds)


def test_http_data_path_against_the_http_ceiling(tmp_path: Path) -> None:
    """Throughput against the ceiling is printed; what is checked is the xts path's own CPU
    per MiB above the ceiling's (within a round, so a slower machine moves both), bounded by
    the cipher, the store and ``OVERHEAD_MS_PER_MIB``. A share of the ceiling's rate is no
    bound: the ceiling got cheaper faster than any volume path can."""
    assert shutil.which("wrk"), "the HTTP benchmark needs wrk: apt-get install wrk"
    server = Server(tmp_path / "data", REQCRYPT_PLUG_WINDOW_US="0", REQCRYPT_BENCH_CEILING="1")
    server.start()
    assert server.process is not None
    pin(server.process.pid)
    cells = {(workload, target): Cell() for workload in WORKLOADS for target in TARGETS}
    try:
        with httpx.Client(
            base_url=server.base, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        ) as client:
            for name in ("pv1", "pv2"):
                client.post("/v1/devices", json={"name": name, "size_bytes": SIZE})
            key = bytes(range(64)).hex()
            xts = f"0 {SIZE // 512} crypt aes-xts-plain64 {key} 0 pv1 0"
            client.post("/v1/volumes", json={"name": "xts", "table": xts})
            client.post(
                "/v1/volumes", json={"name": "lin", "table": f"0 {SIZE // 512} linear pv2 0"}
            )
            prefill(client, TARGETS["xts"])
            prefill(client, TARGETS["linear"])
        assert server.process is not None
        for workload, (method, size, pattern, connections, _) in WORKLOADS.items():
            order = list(TARGETS)
            for _ in range(ROUNDS):
                for target in order:
                    url = server.base + TARGETS[target]
                    cells[(workload, target)].measure(
                        server.process.pid, url, method, size, pattern, connections
                    )
                order = order[1:] + order[:1]
    finally:
        server.stop()
    floor = {method: crypto_and_store_ms(tmp_path / "store", method) for method in ("PUT", "GET")}
    print()
    print(f"server on core {SERVER_CORE}, wrk on the other; CPU per I/O and per MiB: the server's")
    print(
        f"{'workload':18} {'target':11} {'ops/s':>9} {'MB/s':>8} {'vs ceiling':>16} "
        f"{'loop ms/op':>10} {'workers ms/op':>13} {'µs/IO':>8} {'ms/MiB':>7} "
        f"{'wrk cores (max)':>15} {'loop waited':>11} {'others':>6}"
    )
    misses, checks = [], []
    for (workload, target), cell in cells.items():
        method, size, _, _, bounded = WORKLOADS[workload]
        ceiling = cells[(workload, "null")].rates
        ratios = sorted(rate / top for rate, top in zip(cell.rates, ceiling, strict=True))
        rate = median(cell.rates)
        per_io_ms = median(
            loop + workers for loop, workers in zip(cell.loop_ms, cell.workers_ms, strict=True)
        )
        print(
            f"{workload:18} {target:11} {rate:9.0f} {rate * size / 1e6:8.1f} "
            f"{median(ratios):6.0%} ({ratios[0]:.0%}-{ratios[-1]:.0%}) "
            f"{median(cell.loop_ms):10.3f} {median(cell.workers_ms):13.3f} "
            f"{per_io_ms * 1e3:8.0f} {per_io_ms * MIB / size:7.2f} "
            f"{median(cell.client_cores):8.2f} ({max(cell.client_cores):.2f}) "
            f"{median(cell.loop_waits):11.0%} {median(cell.others):6.0%}"
        )
        if target == "xts" and bounded:
            null = cells[(workload, "null")]
            own = median(
                (loop + workers - null_loop - null_workers) * MIB / size
                for loop, workers, null_loop, null_workers in zip(
                    cell.loop_ms, cell.workers_ms, null.loop_ms, null.workers_ms, strict=True
                )
            )
            bound = floor[method] + OVERHEAD_MS_PER_MIB
            checks.append(
                f"{workload}: xts {own:.2f} ms/MiB of server CPU above the ceiling; bound "
                f"{bound:.2f} = OpenSSL XTS + {'pwrite' if method == 'PUT' else 'pread'} "
                f"{floor[method]:.2f} + overhead {OVERHEAD_MS_PER_MIB:.2f}"
            )
            if own > bound:
                misses.append(
                    f"{workload}: xts {own:.2f} ms/MiB above the ceiling (bound {bound:.2f})"
                )
    print(
        "loop waited: the event loop runnable but off its core, behind the server's own "
        "threads too;\nothers: the share of its core's time spent on anything but the server "
        f"(past {CORE_CROWDED:.0%}, a warning below)"
    )
    print("\n".join(checks))
    for warning in busy_clients(
        {f"{workload} on {target}": cell.client_cores for (workload, target), cell in cells.items()}
    ):
        print(warning)
    for warning in crowded_cores(
        {f"{workload} on {target}": cell.others for (workload, target), cell in cells.items()}
    ):
        print(warning)
    assert misses == []


PEER_ROUNDS = 5
"""qemu-img's 256 MiB convert takes well under a second: more rounds than the ceiling table."""
QEMU_SECRET = "secret,id=sec0,data=bench-passphrase"
PEERS = {  # name: (reqcrypt cipher, key bytes, qemu-img LUKS options, target reqcrypt/qemu-img)
    "aes-xts-plain64": (
        "aes-xts-plain64",
        64,
        "cipher-alg=aes-256,cipher-mode=xts,ivgen-alg=plain64",
        1.8,
    ),
    "aes-cbc-essiv:sha256": (
        "aes-cbc-essiv:sha256",
        32,
        "cipher-alg=aes-256,cipher-mode=cbc,ivgen-alg=essiv,ivgen-hash-alg=sha256",
        1.8,
    ),
}


def create_luks(path: Path, options: str) -> None:
    """An empty LUKS image of SIZE with a cheap PBKDF (iter-time 100 ms, the least qemu-img
    takes reliably). qemu-img's PBKDF calibration sometimes fails with "Unable to get
    accurate CPU usage" on a busy machine: retried."""
    command = [
        "qemu-img", "create", "-q", "-f", "luks", "--object", QEMU_SECRET,
        "-o", f"key-secret=sec0,{options},iter-time=100", str(path), str(SIZE),
    ]  # fmt: skip
    for _ in range(10):
        path.unlink(missing_ok=True)
        if subprocess.run(command, capture_output=True).returncode == 0:
            return
    raise AssertionError(f"qemu-img could not create {path}")


def qemu_img_convert(source: Path, image: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of ``qemu-img convert -n`` of ``source`` into the existing LUKS
    ``image``, on the server's core. ``-t unsafe``: no flush at the end, as the PUTs ask for
    none."""
    command = [
        "taskset", "-c", str(SERVER_CORE),
        "qemu-img", "convert", "-n", "-t", "unsafe", "--object", QEMU_SECRET, "-f", "raw",
        "--target-image-opts", str(source), f"driver=luks,key-secret=sec0,file.filename={image}",
    ]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu


def test_http_writes_against_qemu_img_encrypting_into_luks(tmp_path: Path) -> None:
    """MB/s of reqcrypt taking 1 MiB PUTs (4 connections) next to qemu-img's, same rounds, with
    the HTTP ceiling's (the null endpoint) next to them: no volume can beat that ratio.

    qemu-img's figure leaves out its start and LUKS unlock (the keyslot's PBKDF): its
    rate is (256 MiB - 1 MiB) over the time of the full convert minus that of a 1 MiB one.
    CPU per MiB beside it (the server's, all threads; qemu-img's, likewise by difference):
    steadier than rates on a shared machine.
    """
    assert shutil.which("wrk"), "the HTTP benchmark needs wrk: apt-get install wrk"
    assert shutil.which("qemu-img"), "the peer benchmark needs qemu-img: apt-get install qemu-utils"
    source, small = tmp_path / "source.raw", tmp_path / "small.raw"
    with source.open("wb") as raw:
        for _ in range(SIZE // MIB):
            raw.write(os.urandom(MIB))
    small.write_bytes(source.read_bytes()[:MIB])
    images = {name: tmp_path / f"{index}.luks" for index, name in enumerate(PEERS)}
    for name, (_, _, options, _) in PEERS.items():
        create_luks(images[name], options)
        qemu_img_convert(source, images[name])  # allocate the image's blocks, like prefill
    server = Server(tmp_path / "data", REQCRYPT_PLUG_WINDOW_US="0", REQCRYPT_BENCH_CEILING="1")
    server.start()
    assert server.process is not None
    pin(server.process.pid)
    reqcrypt: dict[str, list[float]] = {name: [] for name in PEERS}
    qemu: dict[str, list[float]] = {name: [] for name in PEERS}
    reqcrypt_cpu: dict[str, list[float]] = {name: [] for name in PEERS}
    qemu_cpu: dict[str, list[float]] = {name: [] for name in PEERS}
    ceiling: list[float] = []
    ceiling_cpu: list[float] = []
    cores: dict[str, list[float]] = {name: [] for name in [*PEERS, "null"]}
    others: dict[str, list[float]] = {name: [] for name in [*PEERS, "null"]}
    """The share of each run the server's core spent on other work (``CoreSample.others_since``)."""
    try:
        with httpx.Client(
            base_url=server.base, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        ) as client:
            for index, (cipher, key_bytes, _, _) in enumerate(PEERS.values()):
                client.post("/v1/devices", json={"name": f"pv{index}", "size_bytes": SIZE})
                key = os.urandom(key_bytes).hex()
                table = f"0 {SIZE // 512} crypt {cipher} {key} 0 pv{index} 0"
                client.post("/v1/volumes", json={"name": f"v{index}", "table": table})
                prefill(client, f"/v1/volumes/v{index}/data")
        assert server.process is not None
        pid = server.process.pid
        for _ in range(PEER_ROUNDS):
            for index, name in enumerate(PEERS):
                convert = qemu_img_convert(source, images[name])
                unlock = qemu_img_convert(small, images[name])
                qemu[name].append((SIZE - MIB) / (convert[0] - unlock[0]) / 1e6)
                qemu_cpu[name].append((convert[1] - unlock[1]) / (SIZE // MIB - 1) * 1e3)
                before, core = cpu_seconds(pid), CoreSample.of(pid)
                run = Wrk(f"{server.base}/v1/volumes/v{index}/data", "PUT", MIB, "seq", 4)
                after = cpu_seconds(pid)
                others[name].append(CoreSample.of(pid).others_since(core))
                reqcrypt[name].append(run.rate * MIB / 1e6)
                server_cpu = sum(after) - sum(before)
                reqcrypt_cpu[name].append(server_cpu / (run.rate * DURATION_S) * 1e3)
                cores[name].append(run.client_cores)
            before, core = cpu_seconds(pid), CoreSample.of(pid)
            run = Wrk(f"{server.base}/v1/null/data", "PUT", MIB, "seq", 4)
            after = cpu_seconds(pid)
            others["null"].append(CoreSample.of(pid).others_since(core))
            ceiling.append(run.rate * MIB / 1e6)
            ceiling_cpu.append((sum(after) - sum(before)) / (run.rate * DURATION_S) * 1e3)
            cores["null"].append(run.client_cores)
    finally:
        server.stop()
    print()
    print(f"reqcrypt and qemu-img on core {SERVER_CORE}, wrk on the other; 1 MiB PUTs: one I/O")
    print(
        f"{'cipher':22} {'reqcrypt MB/s':>13} {'qemu-img MB/s':>13} {'ratio':>16} {'target':>7} "
        f"{'ceiling/qemu-img':>16} {'CPU ms/MiB (= ms/IO) reqcrypt, qemu-img':>39} "
        f"{'wrk cores (max)':>15}"
    )
    misses = []
    for name, (_, _, _, target) in PEERS.items():
        ratios = sorted(ours / peer for ours, peer in zip(reqcrypt[name], qemu[name], strict=True))
        bounds = sorted(top / peer for top, peer in zip(ceiling, qemu[name], strict=True))
        print(
            f"{name:22} {median(reqcrypt[name]):13.0f} {median(qemu[name]):13.0f} "
            f"{median(ratios):6.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f}) {target:6.1f}x "
            f"{median(bounds):6.2f}x ({bounds[0]:.2f}-{bounds[-1]:.2f}) "
            f"{median(reqcrypt_cpu[name]):29.2f} {median(qemu_cpu[name]):9.2f} "
            f"{median(cores[name]):8.2f} ({max(cores[name]):.2f})"
        )
        if median(ratios) < target:
            misses.append(f"{name}: reqcrypt {median(ratios):.2f}x qemu-img (target {target}x)")
    print(
        f"HTTP ceiling (/v1/null/data, 1 MiB PUTs): {median(ceiling):.0f} MB/s, server "
        f"{median(ceiling_cpu):.2f} ms/MiB, wrk {median(cores['null']):.2f} of a core "
        f"(at most {max(cores['null']):.2f})"
    )
    for warning in busy_clients(cores):
        print(warning)
    for warning in crowded_cores(others):
        print(warning)
    assert misses == []
