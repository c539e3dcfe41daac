"""A throwaway Ceph cluster for the RBD tests: one monitor and one memstore OSD (data in
RAM) on loopback ports, pool size 1, no auth, everything under one directory.

The RBD tests run for real wherever ``scripts/setup --test`` ran (it installs Debian's
ceph-mon, ceph-osd, ceph-common, librbd1 and librados2); nothing skips.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

POOL = "rbd"


_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _die_with_parent() -> None:
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _ceph_env() -> dict[str, str]:
    """The environment without a caller's CEPH_CONF / CEPH_ARGS."""
    return {key: value for key, value in os.environ.items() if not key.startswith("CEPH_")}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _conf(fsid: str, port: int, root: Path) -> str:
    return f"""\
[global]
fsid = {fsid}
mon host = v2:127.0.0.1:{port}
ms bind msgr1 = false
public addr = 127.0.0.1
auth cluster required = none
auth service required = none
auth client required = none
run dir = {root}/run
crash dir = {root}/crash
log file = {root}/log/$name.log
pid file = {root}/run/$name.pid
admin socket = {root}/run/$name.asok
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon data avail warn = 1
mon data avail crit = 0
# each map change commits in ~50 ms instead of ~1 s
paxos propose interval = 0.05
paxos min wait = 0.01

[mon]
mon data = {root}/mon
mon cluster log file = {root}/log/cluster.log
# no mgr runs here: the mon must not raise MGR_DOWN
mon mgr mkfs grace = 31536000

[osd]
osd data = {root}/osd
osd objectstore = memstore
memstore device bytes = 4294967296
memstore page set = true
osd max pg log entries = 500
osd min pg log entries = 100
osd op num shards = 2
osd op num threads per shard = 1
osd class load list = *
osd class default list = *
"""


@dataclass
class Cluster:
    """A running cluster; ``conf`` is what librados and the ``rbd`` CLI are pointed at."""

    root: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "ceph.conf"

    def run(self, *args: str, timeout: float = 60) -> str:
        """A Ceph CLI command (ceph, rbd, rados) against this cluster; its stdout."""
        done = subprocess.run(
            [args[0], "-c", str(self.conf), *args[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=_ceph_env(),
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def _daemon(self, *args: str) -> None:
        """Run a daemon in the foreground as our child, killed with us (PR_SET_PDEATHSIG):
        a test run that is itself killed leaves no cluster behind."""
        name = args[0].removeprefix("ceph-") + "." + args[-1]
        log = (self.root / "log" / f"{name}.stderr").open("wb")
        process = subprocess.Popen(
            [args[0], "-f", "-c", str(self.conf), *args[1:]],
            stdout=log,
            stderr=log,
            preexec_fn=_die_with_parent,
            env=_ceph_env(),
        )
        log.close()
        self.processes.append(process)
        pid_file = self.root / "run" / f"{name}.pid"
        for _ in range(600):
            if pid_file.exists() and pid_file.read_text().strip():
                return
            if process.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"{name} did not start; see {self.root / 'log'}")

    def start(self) -> None:
        for step in ("mon", "osd", "run", "log", "crash"):
            (self.root / step).mkdir(parents=True, exist_ok=True)
        fsid = str(uuid.uuid4())
        port = _free_port()
        self.conf.write_text(_conf(fsid, port, self.root))
        monmap = self.root / "monmap"
        self.run(
            "monmaptool", "--create", "--fsid", fsid, "--addv", "a",
            f"[v2:127.0.0.1:{port}]", str(monmap),
        )  # fmt: skip
        self.run("ceph-mon", "--mkfs", "--monmap", str(monmap), "--keyring", "/dev/null", "-i", "a")
        self._daemon("ceph-mon", "-i", "a")
        osd_uuid = str(uuid.uuid4())
        osd_id = self.run("ceph", "osd", "new", osd_uuid).strip()
        self.run("ceph-osd", "--mkfs", "--osd-uuid", osd_uuid, "-i", osd_id)
        self._daemon("ceph-osd", "-i", osd_id)
        self.run("ceph", "osd", "pool", "create", POOL, "8", "8")
        self.run("rbd", "pool", "init", POOL)  # returns once the pool's PGs are active

    def stop(self) -> None:
        """Stop the OSD, then the monitor."""
        for process in reversed(self.processes):
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes.clear()

    @contextmanager
    def osd_paused(self) -> Iterator[None]:
        """The OSD stopped (SIGSTOP): ops sent to it wait, without failing, until it resumes."""
        (osd,) = [process for process in self.processes if process.args[0] == "ceph-osd"]
        osd.send_signal(signal.SIGSTOP)
        _wait_stopped(osd.pid)
        try:
            yield
        finally:
            osd.send_signal(signal.SIGCONT)

    def images(self, pool: str = POOL) -> list[str]:
        return self.run("rbd", "ls", pool).split()

    def export(self, image: str, pool: str = POOL) -> bytes:
        """The image's bytes as ``rbd export`` reads them (another client than the service)."""
        out = self.root / f"{image}.export"
        out.unlink(missing_ok=True)
        self.run("rbd", "export", f"{pool}/{image}", str(out))
        data = out.read_bytes()
        out.unlink()
        return data


def _wait_stopped(pid: int, timeout: float = 10) -> None:
    """kill(2) returns before every thread of the process has stopped; an op sent meanwhile
    could still be served. Wait until each thread is in the stopped state."""
    deadline = time.monotonic() + timeout
    tasks = Path(f"/proc/{pid}/task")
    while time.monotonic() < deadline:
        states = []
        for task in tasks.iterdir():
            with contextlib.suppress(FileNotFoundError):
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        if states and all(state in "tT" for state in states):
            return
        time.sleep(0.001)
    raise TimeoutError(f"process {pid} did not stop")


def start(root: Path) -> Cluster:
    cluster = Cluster(root)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster
