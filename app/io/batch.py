"""The one way into a volume: a batch of ``Io``s, run on a worker or started on the loop.

Threading model. ``execute`` blocks (admission may wait for a resume, a
read-modify-write for its range, FUA for fsync): it runs on the executor.
``start_inline`` is for the event loop itself: it starts a batch only when nothing
in it can wait on another thread, a timer or the network (the volume serves
promptly, every I/O is a whole-block read or write, admission would not wait).
``submit`` picks between the two and returns a future of the loop, done when the
whole batch is: a batch started inline that is not complete at once (a request
left behind another thread's) is finished on a worker. A hop to a worker and back,
two threads taking turns at the GIL, costs a 4 KiB write about half its CPU.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

from app.dm.datapath import DataPath, StartedBatch
from app.dm.generation import Precondition
from app.io.executor import IoExecutor
from app.io.ops import Io


def execute(
    volume: DataPath, ios: Sequence[Io], *, precondition: Precondition | None = None
) -> int:
    """Run the batch to its end (``DataPath.submit_batch``); returns the version it made."""
    return volume.submit_batch(ios, precondition=precondition)


def run(volume: DataPath, io: Io, *, precondition: Precondition | None = None) -> int:
    """One I/O as a batch of one, its failure raised; returns the version it made."""
    version = volume.submit_batch((io,), precondition=precondition)
    if io.error is not None:
        raise io.error
    return version


def start_inline(volume: DataPath, ios: Sequence[Io]) -> StartedBatch | None:
    """Start the batch on this thread if nothing in it can wait; None: not started."""
    if not volume.serves_promptly():
        return None
    return volume.start_batch(ios, wait=False)


def submit(
    executor: IoExecutor, volume: DataPath, ios: Sequence[Io], *, inline: bool
) -> asyncio.Future[Any]:
    """The batch as a future: started here when ``inline`` allows and it can be, else one
    executor job. A shut-down executor fails the future; what was queued still ends."""
    started = start_inline(volume, ios) if inline else None
    try:
        if started is None:
            return executor.submit(execute, volume, ios)
        if not started.done():
            return executor.submit(started.finish)
    except RuntimeError as error:
        if started is not None:
            threading.Thread(target=started.finish, daemon=True).start()
        failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        failed.set_exception(error)
        return failed
    started.finish()
    finished: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    finished.set_result(None)
    return finished
