"""A volume's content version, the ETag's number: a sequence lock over its writes.

Writers count themselves in and out (``writing``) and the version moves when one
finishes. A reader takes a ``snapshot`` (none while a write is in flight), reads,
and keeps the version only if no write started meanwhile: so a version is never
served with two different contents. A conditional write checks its precondition
and runs under one lock (``conditional``), so of N writers holding one ETag
exactly one passes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from app.errors import PreconditionFailed

#: A precondition on the current version (an If-Match header, say).
Precondition = Callable[[int], bool]


class Generation:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conditional = threading.Lock()
        self._value = 0
        self._started = 0
        self._active = 0

    @property
    def value(self) -> int:
        return self._value

    def bump(self) -> None:
        """The content changed outside a write (a table swap)."""
        with self._lock:
            self._value += 1

    @contextmanager
    def writing(self) -> Iterator[list[int]]:
        """Count one write in flight; the yielded list gets the version it made."""
        made: list[int] = []
        with self._lock:
            self._started += 1
            self._active += 1
        try:
            yield made
        finally:
            with self._lock:
                self._active -= 1
                self._value += 1
                made.append(self._value)

    @contextmanager
    def conditional(self, precondition: Precondition | None) -> Iterator[None]:
        """Hold ``precondition`` true from its check to the end of the block."""
        if precondition is None:
            yield
            return
        with self._conditional:
            if not precondition(self._value):
                raise PreconditionFailed("If-Match does not match the volume's current ETag")
            yield

    def snapshot(self) -> tuple[int, int] | None:
        """(version, writes started) when no write is in flight, else None."""
        with self._lock:
            return None if self._active else (self._value, self._started)

    def unchanged_since(self, snapshot: tuple[int, int]) -> bool:
        with self._lock:
            return self._started == snapshot[1]
