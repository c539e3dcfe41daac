"""Which of ``app/_native.c``'s AES paths the run took, said once at its end.

A run on one process records and reports them itself; under pytest-xdist each worker hands
its set to the controller (``workeroutput``), which reports the union."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from app import _native

ALL_PATHS = ("avx512", "avx2", "aesni", "openssl")
WORKER_OUTPUT_KEY = "reqcrypt_aes_paths_run"


def why_not(path: str) -> str:
    """What the CPU lacks for path, in set_path's words."""
    before = _native.path()
    try:
        _native.set_path(path)
    except RuntimeError as error:
        return str(error)
    finally:
        _native.set_path(before)
    raise AssertionError(f"{path} is runnable")


def report(terminalreporter: pytest.TerminalReporter, ran: Iterable[str]) -> None:
    """The run's closing lines on the AES paths: those run, and why any other was not."""
    taken = set(ran)
    if not taken:
        return
    order = [name for name in ALL_PATHS if name in taken]
    terminalreporter.write_line(f"AES paths run: {', '.join(order)}")
    for name in ALL_PATHS:
        if name not in _native.PATHS:
            terminalreporter.write_line(f"AES path not run: {why_not(name)}")
