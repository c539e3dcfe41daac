"""A thread pool for the data path whose completions reach the event loop in batches.

Crypto and file I/O must leave the event loop, but anyio's ``to_thread`` costs a
wake-up and a loop callback per call, which dominates small I/O. Here a busy
worker takes the next job without sleeping, and finished jobs are handed back
with one wake-up of the loop per burst instead of one per job. Workers are
many (jobs may block: plug windows, suspended volumes, fsync) and grow on demand.

A round trip is two thread switches, not six: each side wakes the other only where it
holds no GIL. The loop is woken through the executor's own eventfd, written with the
GIL released (``call_soon_threadsafe`` writes its wake-up under the GIL, so a woken
loop blocks at once on the GIL the worker still holds), and workers are ``SCHED_BATCH``
threads: a job submitted by the loop does not preempt the loop, which holds the GIL
the worker would wait for, but starts when the loop blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
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
        self._wakeup = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

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
            if loop is not self._loop:
                self._attach(loop)
            self._jobs.append((func, args, future))
            if self._idle:
                self._idle.pop().release()
            elif self._workers < self.max_workers:
                self._workers += 1
                threading.Thread(target=self._work, name="reqcrypt-io", daemon=True).start()
        return future

    def _attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Deliver to ``loop`` from now on (a new loop replaces a closed one: tests)."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._wakeup)
        loop.add_reader(self._wakeup, self._deliver)
        self._loop = loop

    def _work(self) -> None:
        """Last idle, first woken: the threads that just ran keep their buffers and cipher
        contexts warm in cache."""
        # Not permitted everywhere (seccomp, other kernels): only the switches it saves.
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        wake = threading.Lock()
        wake.acquire()
        with self._lock:
            job = self._jobs.popleft() if self._jobs else None
        while True:
            first = False
            if job is not None:
                func, args, future = job
                try:
                    outcome: tuple[Any, BaseException | None] = (func(*args), None)
                except BaseException as exc:
                    outcome = (None, exc)
            with self._lock:
                if job is not None:
                    first = not self._done
                    self._done.append((future, *outcome))
                    # Idle, this frame would keep the last job's buffers alive.
                    del func, args, future, outcome
                job = self._jobs.popleft() if self._jobs else None
                if job is None and self._closed:
                    self._workers -= 1
                    # Under the lock: once the loop sees no workers it closes the eventfd.
                    os.eventfd_write(self._wakeup, 1)
                    return
                if job is None:
                    self._idle.append(wake)
            # Idle before waking the loop: a job it submits at once finds this thread.
            if first:
                os.eventfd_write(self._wakeup, 1)
            if job is None:
                wake.acquire()
                with self._lock:
                    job = self._jobs.popleft() if self._jobs else None

    def _deliver(self) -> None:
        os.eventfd_read(self._wakeup)
        with self._lock:
            done, self._done = self._done, []
            finished = self._closed and not self._workers
        for future, result, error in done:
            if future.cancelled():
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)
        if finished:
            self._detach()

    def _detach(self) -> None:
        """Forget the loop and close the eventfd: no worker is left to write it."""
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self._wakeup)
        os.close(self._wakeup)

    def shutdown(self) -> None:
        """Refuse new jobs; the queued and running ones still end and are delivered. From
        the event loop (or with none running)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            idle, self._idle = self._idle, []
            finished = not self._workers
        if finished:
            self._detach()
        for wake in idle:
            wake.release()
