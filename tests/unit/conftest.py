"""The AES paths of ``app/_native.c``: tests that take ``aes_path`` (or ``lane_path``) run
once per path this CPU can run, and the run ends with a line saying which ran and why any
other could not (no test is skipped for a missing CPU feature: it is not parametrized)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app import _native
from tests.support import aes_paths

LANE_PATHS = tuple(name for name in _native.PATHS if name != "openssl")
"""The paths with native AES-CBC lanes: every one but openssl."""

_ran: set[str] = set()


def _take(path: str) -> Iterator[str]:
    before = _native.path()
    _native.set_path(path)
    _ran.add(path)
    try:
        yield path
    finally:
        _native.set_path(before)


@pytest.fixture(params=_native.PATHS)
def aes_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each path the CPU can run, set for the test and restored after."""
    yield from _take(str(request.param))


@pytest.fixture(params=LANE_PATHS)
def lane_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each path with native AES-CBC lanes the CPU can run."""
    yield from _take(str(request.param))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under xdist, this worker's paths go to the controller, which reports them."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output[aes_paths.WORKER_OUTPUT_KEY] = sorted(_ran)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    aes_paths.report(terminalreporter, _ran)
