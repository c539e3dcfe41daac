"""A thread pool for the data path whose completions reach the event loop in batches.

Crypto and file I/O must leave the event loop, but anyio's ``to_thread`` costs a
wake-up and a loop callback per call, which dominates small I/O. Here a busy
worker takes the next job without sleeping, and finished jobs are handed back
with one ``call_soon_threadsafe`` per burst instead of one per job. Workers are
many (jobs may block: plug windows, suspended volumes, fsync) and grow on demand.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_Job = tuple[Callable[..., Any], tuple[Any, ...], "asyncio.Future[Any]"]


class IoExecutor:
    def __init__(self, max_workers: int = 64) -> None:
        self.max_workers = max_workers
        self._lock = threading.Lock()
        self._jobs: deque[_Job] = deque()
        self._done: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._workers = 0
        self._idle: list[threading.Lock] = []
        self._closed = False

    async def run(self, func: Callable[..., T], *args: Any) -> T:
        """Run ``func(*args)`` on a worker thread and await its result."""
        return await self.submit(func, *args)

    def submit(self, func: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Queue ``func(*args)`` for a worker; from the event loop. The future's done
        callbacks run in the delivering loop pass: no task, no coroutine per job."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the I/O executor is shut down")
            self._loop = loop
            self._jobs.append((func, args, future))
            if self._idle:
                self._idle.pop().release()
            elif self._workers < self.max_workers:
                self._workers += 1
                threading.Thread(target=self._work, name="reqcrypt-io", daemon=True).start()
        return future

    def _work(self) -> None:
        """Last idle, first woken: the threads that just ran keep their buffers and cipher
        contexts warm in cache."""
        wake = threading.Lock()
        wake.acquire()
        while True:
            with self._lock:
                job = self._jobs.popleft() if self._jobs else None
                if job is None:
                    if self._closed:
                        self._workers -= 1
                        return
                    self._idle.append(wake)
            if job is None:
                wake.acquire()
                continue
            func, args, future = job
            try:
                outcome: tuple[Any, BaseException | None] = (func(*args), None)
            except BaseException as exc:
                outcome = (None, exc)
            with self._lock:
                first = not self._done
                self._done.append((future, *outcome))
                loop = self._loop
            if first and loop is not None:
                # RuntimeError: the loop closed while the job ran, and nobody awaits it.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            done, self._done = self._done, []
        for future, result, error in done:
            if future.cancelled():
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for wake in idle:
            wake.release()
