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
from collections.abc import Callable

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

    def writing(self) -> _Writing:
        """Count one write in flight for a ``with`` block; the list it gives gets the
        version the write made."""
        return _Writing(self)

    def conditional(self, precondition: Precondition | None) -> _Conditional:
        """Hold ``precondition`` true from its check to the end of the ``with`` block."""
        return _Conditional(self, precondition)

    def _start(self) -> None:
        with self._lock:
            self._started += 1
            self._active += 1

    def _end(self) -> int:
        with self._lock:
            self._active -= 1
            self._value += 1
            return self._value

    def snapshot(self) -> tuple[int, int] | None:
        """(version, writes started) when no write is in flight, else None."""
        with self._lock:
            return None if self._active else (self._value, self._started)

    def unchanged_since(self, snapshot: tuple[int, int]) -> bool:
        with self._lock:
            return self._started == snapshot[1]


# Classes, not generator context managers: every write enters both (a third of the cost).


class _Writing:
    __slots__ = ("_generation", "_made")

    def __init__(self, generation: Generation) -> None:
        self._generation = generation
        self._made: list[int] = []

    def __enter__(self) -> list[int]:
        self._generation._start()
        return self._made

    def __exit__(self, *_: object) -> None:
        self._made.append(self._generation._end())


class _Conditional:
    __slots__ = ("_generation", "_precondition")

    def __init__(self, generation: Generation, precondition: Precondition | None) -> None:
        self._generation = generation
        self._precondition = precondition

    def __enter__(self) -> None:
        if self._precondition is None:
            return
        generation = self._generation
        generation._conditional.acquire()
        try:
            holds = self._precondition(generation._value)
        except BaseException:
            generation._conditional.release()
            raise
        if not holds:
            generation._conditional.release()
            raise PreconditionFailed("If-Match does not match the volume's current ETag")

    def __exit__(self, *_: object) -> None:
        if self._precondition is not None:
            self._generation._conditional.release()
