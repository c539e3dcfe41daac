"""Benchmarks that measure the server, not the load generator, on a 2-core machine.

The server (and a peer server, in turn) runs on one core, the load generator on the other
(``taskset``, util-linux): without that, wrk or fio take CPU the server would have used and
the figure is theirs. A peer that is server and client in one process (qemu-img convert,
fio's rbd engine) runs on the server core: it is held to the one core the server has. Each
client run is measured from ``/proc/<pid>/stat`` (its CPU over its wall time, the process as
a whole with the children it waited for) and printed beside the figure; a client that comes
near a core makes the run suspect, which is printed as a warning rather than failing it (the
machine is shared, and the figures are still the best this run has). So does a server core
that other work took a share of: other processes, kernel threads working outside the
server's threads, or a hypervisor that ran something else.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
CORES = sorted(os.sched_getaffinity(0))
SERVER_CORE = CORES[0]
CLIENT_CORE = CORES[-1]
"""One core each where there are two; with one, both share it (and pinning is moot)."""
CLIENT_BUSY = 0.8
"""Client CPU per second of its run past which the run is flagged: a saturated client (1.0
for wrk -t1 or one fio job) bounds the rate, not the server."""
CORE_CROWDED = 0.1
"""Share of a run the server's core spent on other work than the server's threads past which
the run is flagged: that work, not the server, may have set its rate."""


def _task_seconds(pid: int) -> Iterator[tuple[str, str, float]]:
    """(thread id, thread name, user + system CPU seconds) of each thread of ``pid``."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # a thread that just ended
            continue
        yield task.name, comm, (int(fields[11]) + int(fields[12])) / TICKS


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(main thread, all other threads) user + system CPU seconds of ``pid``."""
    main = others = 0.0
    for tid, _, seconds in _task_seconds(pid):
        if tid == str(pid):
            main += seconds
        else:
            others += seconds
    return main, others


def thread_group_seconds(pid: int) -> dict[str, float]:
    """User + system CPU seconds of ``pid``'s threads by kind: ``own`` (the threads named as
    the process is: neither CPython nor qemu names its threads), ``messenger`` (librados'
    ``msgr-worker-*``) and ``librados`` (librados' and librbd's other named threads)."""
    groups = {"own": 0.0, "messenger": 0.0, "librados": 0.0}
    process = Path(f"/proc/{pid}/comm").read_text()
    for _, comm, seconds in _task_seconds(pid):
        if comm == process:
            groups["own"] += seconds
        elif comm.startswith("msgr-worker"):
            groups["messenger"] += seconds
        else:
            groups["librados"] += seconds
    return groups


def runqueue_seconds(pid: int) -> float:
    """Seconds the main thread (the event loop) of ``pid`` has been runnable but not running
    (``/proc/<pid>/task/<pid>/schedstat``): behind other processes, and behind the server's
    own threads where they share its core."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[1]) / 1e9


def run_seconds(pid: int) -> float:
    """Seconds the live threads of ``pid`` have run (the first field of each
    ``/proc/<pid>/task/*/schedstat``, in ns; exact, where ``stat`` counts ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except FileNotFoundError:  # a thread that just ended
            continue
    return total / 1e9


def idle_seconds(core: int) -> float:
    """Seconds ``core`` has been idle, waiting for I/O or not (``/proc/stat``: idle and
    iowait, which a tickless kernel times from idle entry to exit rather than by ticks)."""
    for line in Path("/proc/stat").read_text().splitlines():
        fields = line.split()
        if fields[0] == f"cpu{core}":
            return (int(fields[4]) + int(fields[5])) / TICKS
    raise AssertionError(f"no cpu{core} in /proc/stat")


@dataclass(frozen=True)
class CoreSample:
    """The server's core at one instant, for the shares of a run between two samples."""

    at: float
    idle_s: float
    server_s: float
    loop_waited_s: float

    @classmethod
    def of(cls, pid: int, core: int = SERVER_CORE) -> CoreSample:
        return cls(time.monotonic(), idle_seconds(core), run_seconds(pid), runqueue_seconds(pid))

    def others_since(self, before: CoreSample) -> float:
        """The share of the wall time since ``before`` the core was busy but not running the
        server's threads: other processes, kernel threads, interrupts taken while idle, time
        a hypervisor ran something else. The server's own hand-offs are not in it."""
        wall = self.at - before.at
        busy = wall - (self.idle_s - before.idle_s)
        return max(0.0, busy - (self.server_s - before.server_s)) / wall

    def loop_waited_since(self, before: CoreSample) -> float:
        """The share of the wall time since ``before`` the event loop was runnable but off the
        core, behind the server's own threads as well as other work."""
        return (self.loop_waited_s - before.loop_waited_s) / (self.at - before.at)


def pin(pid: int, core: int = SERVER_CORE) -> None:
    """Every thread of ``pid`` onto ``core``; threads it starts later inherit it."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), {core})
        except ProcessLookupError:  # a thread that just ended
            continue


def on_core(command: list[str], core: int = CLIENT_CORE) -> list[str]:
    assert shutil.which("taskset"), "pinning needs taskset: apt-get install util-linux"
    return ["taskset", "-c", str(core), *command]


@dataclass(frozen=True)
class ClientRun:
    stdout: str
    stderr: str
    returncode: int
    cpu_s: float
    wall_s: float

    @property
    def cores(self) -> float:
        """The client's CPU per second of its run."""
        return self.cpu_s / self.wall_s


def run_client(
    command: list[str], env: dict[str, str] | None = None, core: int = CLIENT_CORE
) -> ClientRun:
    """Run a load generator on ``core`` (the client core; the server core for a peer that is
    server and client in one); its CPU is read from ``/proc/<pid>/stat`` once it has exited
    and before it is reaped (``waitid(WNOWAIT)``), so it covers the whole process, every
    thread, and the children it waited for (fio runs its jobs in forked processes: utime +
    stime + cutime + cstime). Output goes through files: a pipe left unread could stall it."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        process = subprocess.Popen(on_core(command, core), stdout=out, stderr=err, env=env)
        os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
        wall = time.perf_counter() - start
        fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        returncode = process.wait()
        out.seek(0)
        err.seek(0)
        return ClientRun(
            out.read().decode(),
            err.read().decode(),
            returncode,
            sum(int(field) for field in fields[11:15]) / TICKS,
            wall,
        )


def busy_clients(cores: dict[str, list[float]]) -> list[str]:
    """Warnings for the figures whose client came near a core in some round."""
    return [
        f"WARNING: {name}: the client used up to {max(values):.2f} of a core; "
        "the figure may be the client's"
        for name, values in cores.items()
        if values and max(values) >= CLIENT_BUSY
    ]


def crowded_cores(others: dict[str, list[float]]) -> list[str]:
    """Warnings for the figures whose server core other work took (``others_since``) past
    ``CORE_CROWDED`` of some round."""
    return [
        f"WARNING: {name}: other work than the server took up to {max(values):.0%} of its "
        "core; the figure may be the machine's load"
        for name, values in others.items()
        if values and max(values) >= CORE_CROWDED
    ]
