"""NBD throughput against qemu-nbd serving a LUKS image of the same cipher, in one run
(run with -m bench), and a real client's queue depth turned into request merging.

fio's nbd engine (C, libnbd) drives both servers with the same jobs; each workload runs
on reqcrypt and on qemu-nbd back to back, ROUNDS times interleaved, and the median ratio
is kept. Each server runs on one core and fio on the other (``tests/bench/cores.py``); fio's
CPU (``/proc/<pid>/stat``, the whole process) and the server's CPU per I/O and per MiB are
printed beside each figure, and a round where fio came near a core is flagged, not failed.
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import median
from typing import Any

import pytest

from tests.bench.cores import SERVER_CORE, busy_clients, cpu_seconds, pin, run_client
from tests.bench.qemu_nbd import QemuNbd
from tests.support.keys import XTS_KEY
from tests.support.nbd_servers import make_export
from tests.support.ports import free_port
from tests.support.servers import Server

pytestmark = pytest.mark.bench
MIB = 1 << 20
SIZE = 512 * MIB
DURATION_S = 6
ROUNDS = 3
WORKLOADS = {  # name: (fio rw, block size, iodepth, target ratio reqcrypt / qemu-nbd)
    "seq write 1 MiB": ("write", "1M", 8, 4.0),
    "rand write 4 KiB": ("randwrite", "4k", 32, 0.6),
    "rand read 4 KiB": ("randread", "4k", 32, 0.6),
    "seq read 1 MiB": ("read", "1M", 8, 4.0),
}


def fio(uri: str, rw: str, bs: str, iodepth: int, **extra: str) -> tuple[dict[str, Any], float]:
    """fio's job and its CPU per second of its run, on the client core."""
    options = {
        "name": "bench",
        "ioengine": "nbd",
        "uri": uri,
        "rw": rw,
        "bs": bs,
        "iodepth": str(iodepth),
        "size": str(SIZE),
        "output-format": "json",
        **extra,
    }
    run = run_client(["fio", *(f"--{key}={value}" for key, value in options.items())])
    assert run.returncode == 0, run.stderr
    job: dict[str, Any] = json.loads(run.stdout[run.stdout.index("{") :])["jobs"][0]
    assert job["error"] == 0
    return job, run.cores


def timed_fio(pid: int, uri: str, rw: str, bs: str, iodepth: int) -> dict[str, float]:
    """IOPS, MB/s, the server's CPU seconds per second, per I/O and per MiB (over the ramp and
    the run, at the run's rate), and fio's CPU per second."""
    before = sum(cpu_seconds(pid))
    job, client = fio(uri, rw, bs, iodepth, time_based="1", runtime=str(DURATION_S), ramp_time="1")
    server_cpu = (sum(cpu_seconds(pid)) - before) / (DURATION_S + 1)
    side = job["read"] if "read" in rw else job["write"]
    return {
        "iops": side["iops"],
        "mb_s": side["bw_bytes"] / 1e6,
        "server_cpu": server_cpu,
        "server_us_per_io": server_cpu / side["iops"] * 1e6,
        "server_ms_per_mib": server_cpu / (side["bw_bytes"] / MIB) * 1e3,
        "client_cpu": client,
    }


def test_nbd_against_qemu_nbd_and_queue_merging(tmp_path: Path) -> None:
    nbd_port = free_port()
    server = Server(tmp_path / "data", REQCRYPT_NBD_PORT=str(nbd_port))
    server.start()
    qemu = QemuNbd(tmp_path, SIZE)
    try:
        qemu.start()
        assert server.process is not None
        assert qemu.process is not None
        pin(server.process.pid)
        pin(qemu.process.pid)
        with server.client() as http:
            for device, size in (("pv", SIZE), ("slow", 64 * MIB)):
                assert http.post(
                    "/v1/devices", json={"name": device, "size_bytes": size}
                ).is_success
            make_export(http, "xts", f"0 {SIZE // 512} crypt aes-xts-plain64 {XTS_KEY} 0 pv 0")
            make_export(
                http,
                "am",
                f"0 {64 * MIB // 512} crypt aes-cbc-plain64 {XTS_KEY[:64]} 0 slow 0",
                engine="omap-aes-am335x",
                dispatch_mode="request",
            )
            ours = f"nbd://127.0.0.1:{nbd_port}/xts"
            rows = []
            failures = []
            client_cores: dict[str, list[float]] = {}
            for name, (rw, bs, iodepth, target) in WORKLOADS.items():
                runs: dict[str, list[dict[str, float]]] = {"reqcrypt": [], "qemu-nbd": []}
                for _ in range(ROUNDS):
                    runs["reqcrypt"].append(timed_fio(server.process.pid, ours, rw, bs, iodepth))
                    runs["qemu-nbd"].append(timed_fio(qemu.process.pid, qemu.uri, rw, bs, iodepth))
                metric = "iops" if bs == "4k" else "mb_s"
                ratio = median(
                    ours_run[metric] / theirs[metric]
                    for ours_run, theirs in zip(runs["reqcrypt"], runs["qemu-nbd"], strict=True)
                )
                best = {who: max(r[metric] for r in found) for who, found in runs.items()}
                cpu = {
                    who: {
                        key: median(r[key] for r in found)
                        for key in ("server_cpu", "server_us_per_io", "server_ms_per_mib")
                    }
                    for who, found in runs.items()
                }
                for who, found in runs.items():
                    client_cores[f"{name} on {who}"] = [r["client_cpu"] for r in found]
                rows.append((name, metric, best, cpu, ratio, target))
                if ratio < target:
                    failures.append(f"{name}: {ratio:.2f}x qemu-nbd, target {target}x")

            http.post("/v1/volumes/am/stats/reset")
            fio(f"nbd://127.0.0.1:{nbd_port}/am", "write", "4k", 32, size=str(32 * MIB))
            # (fio's CPU is not of interest here: the merging is.)
            stats = http.get("/v1/volumes/am/status").json()["stats"]
    finally:
        qemu.stop()
        server.stop()

    print(
        f"\nfio nbd engine, {DURATION_S} s runs, median ratio of {ROUNDS} interleaved rounds; "
        f"servers on core {SERVER_CORE}, fio on the other"
    )
    print(f"{'workload':<18}{'reqcrypt':>12}{'qemu-nbd':>12}{'ratio':>8}{'target':>8}"
          f"   server cores, µs/IO, ms/MiB (ours / qemu)      fio cores (ours / qemu)")  # fmt: skip
    for name, metric, best, cpu, ratio, target in rows:
        unit = "IOPS" if metric == "iops" else "MB/s"
        ours, theirs = cpu["reqcrypt"], cpu["qemu-nbd"]
        fio_cores = [median(client_cores[f"{name} on {who}"]) for who in ("reqcrypt", "qemu-nbd")]
        print(
            f"{name:<18}{best['reqcrypt']:>8.0f}{unit:>5}{best['qemu-nbd']:>8.0f}{unit:>5}"
            f"{ratio:>7.2f}x{target:>7.1f}x   "
            f"{ours['server_cpu']:4.2f} {ours['server_us_per_io']:6.0f} "
            f"{ours['server_ms_per_mib']:6.2f} / {theirs['server_cpu']:4.2f} "
            f"{theirs['server_us_per_io']:6.0f} {theirs['server_ms_per_mib']:6.2f}"
            f"      {fio_cores[0]:4.2f} / {fio_cores[1]:4.2f}"
        )
    for warning in busy_clients(client_cores):
        print(warning)
    calls_per_bio = stats["engine_calls"] / stats["w_bios"]
    print(
        f"omap-aes-am335x, request mode, fio seq 4 KiB writes iodepth 32: wareq_sz "
        f"{stats['wareq_sz']:.1f} KiB, {stats['w_bios']} bios -> {stats['w_ios']} requests, "
        f"{stats['engine_calls']} engine calls ({calls_per_bio:.3f} per bio)"
    )
    if stats["wareq_sz"] < 64:
        failures.append(f"wareq_sz {stats['wareq_sz']:.1f} KiB < 64")
    if calls_per_bio > 1 / 16:
        failures.append(f"engine calls per bio {calls_per_bio:.3f} > 1/16")
    assert not failures, failures
