"""CPU per 4 KiB NBD I/O of the server's request path, in process (run with -m bench).

``tests/bench/nbd_drive.py`` drives one NBD connection with fio's 4 KiB random I/O at
queue depth 32 through a stub transport: no sockets, no client. Each measurement is a
child process pinned to the server core running a short and a long drive; the
difference of their CPU over the difference of their I/Os leaves out start-up. Printed,
not asserted: the figure is the machine's; under callgrind (see the driver) it is an
instruction count.
"""

from __future__ import annotations

import resource
import subprocess
import sys
from statistics import median

import pytest

from tests.bench.cores import SERVER_CORE

pytestmark = pytest.mark.bench
SHORT, LONG = 2_000, 22_000
ROUNDS = 3


def cpu_seconds(op: str, count: int) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    command = [sys.executable, "-m", "tests.bench.nbd_drive", op, str(count)]
    subprocess.run(["taskset", "-c", str(SERVER_CORE), *command], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


@pytest.mark.parametrize("op", ["write", "read"])
def test_cpu_per_4k_nbd_io_in_process(op: str) -> None:
    runs = [
        (cpu_seconds(op, LONG) - cpu_seconds(op, SHORT)) / (LONG - SHORT) * 1e6
        for _ in range(ROUNDS)
    ]
    print(
        f"\n4 KiB random {op}s, NBD connection in process: {median(runs):.1f} us CPU per I/O "
        f"(rounds {', '.join(f'{run:.1f}' for run in runs)})"
    )
