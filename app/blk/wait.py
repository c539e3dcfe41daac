"""Wait primitives of the block layer, shaped like the kernel's.

``Completion`` is ``struct completion``; ``WaitQueue`` is a condition whose
``notify_all`` returns at once when nobody waits (``wake_up`` after
``wq_has_sleeper``). Python's ``threading.Condition`` and ``Event`` are written in
Python: creating, setting and notifying them costs microseconds on every I/O.
"""

from __future__ import annotations

import threading


class WouldBlock(Exception):
    """A non-waiting attempt found that it would have to wait; nothing was done."""


class Completion:
    """``struct completion``: set once, any number of waiters.

    A lock held until completion, rather than a ``threading.Event``: an Event is a
    Condition in Python, a few microseconds to create and to set, once per bio.
    """

    __slots__ = ("_done", "_latch")

    def __init__(self) -> None:
        self._latch = threading.Lock()
        self._latch.acquire()
        self._done = False

    def is_set(self) -> bool:
        return self._done

    def set(self) -> None:
        """Complete; called once per bio (``bio_endio`` of its last piece)."""
        if not self._done:
            self._done = True
            self._latch.release()

    def wait(self, timeout: float | None = None) -> bool:
        """True once completed; False if ``timeout`` seconds passed first."""
        if self._done:
            return True
        if self._latch.acquire(timeout=-1 if timeout is None else timeout):
            self._latch.release()  # let the next waiter through
            return True
        return self._done


class WaitQueue(threading.Condition):
    """A ``threading.Condition`` that counts its sleepers: waking nobody is free."""

    def __init__(self, lock: threading.Lock | threading.RLock | None = None) -> None:
        super().__init__(lock)
        self._sleepers = 0

    def wait(self, timeout: float | None = None) -> bool:
        self._sleepers += 1
        try:
            return super().wait(timeout)
        finally:
            self._sleepers -= 1

    def notify_all(self) -> None:
        if self._sleepers:
            super().notify_all()
