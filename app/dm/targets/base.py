"""The target interface and what a target maps onto."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from typing_extensions import Buffer

from app.blk.request import Request
from app.vocab import DispatchMode, Wait, completed


class BlockDevice(Protocol):
    """What a target maps onto: a backing store, or another volume when stacked."""

    @property
    def size(self) -> int: ...

    @property
    def prompt(self) -> bool:
        """I/O returns without waiting on another thread, a timer or the network."""
        ...

    def read_into(self, offset: int, buffer: memoryview) -> None: ...

    def write(self, offset: int, data: Buffer) -> object: ...

    def readv_into(self, offset: int, buffers: Sequence[memoryview]) -> None: ...

    def writev(self, offset: int, buffers: Sequence[Buffer]) -> None: ...

    def submit_readv(self, offset: int, buffers: Sequence[memoryview]) -> Wait:
        """``readv_into`` started: the buffers are filled once the returned wait returns."""
        ...

    def submit_writev(self, offset: int, buffers: Sequence[Buffer]) -> Wait:
        """``writev`` started: done once the returned wait returns; ``buffers`` are free at once."""
        ...

    def flush(self) -> None: ...

    def discard(self, offset: int, length: int) -> None: ...

    def write_zeroes(self, offset: int, length: int) -> None: ...


@dataclass(frozen=True, slots=True)
class MapContext:
    """Per-dispatch facts a target needs beyond the request itself: the volume's dispatch
    mode and dm-crypt's split sizes (``None``: no split below the engine's own limit)."""

    dispatch_mode: DispatchMode
    max_read_bytes: int | None = None
    max_write_bytes: int | None = None


@dataclass(slots=True)
class MapResult:
    """A request's engine calls and modelled time (not frozen: one is built per request).

    ``queue_ns`` is the modelled time of dm-crypt's queue hops the request took."""

    engine_calls: int = 0
    modelled_ns: int = 0
    queue_ns: float = 0.0


Started: TypeAlias = "MapResult | Callable[[], MapResult]"
"""What ``Target.submit`` returns: the result of a request already done, or what finishes it."""


def finished(started: Started) -> MapResult:
    """The result of a submitted request once it is done (``map`` of a target that submits)."""
    return started if isinstance(started, MapResult) else started()


def finish_io(device: BlockDevice, request: Request, wait: Wait, result: MapResult) -> Started:
    """What finishes a read or write started on ``device``: wait for it, then, for a FUA
    request, flush the device's cache (the block layer's post-flush: a ``BlockDevice``
    has no FUA write), and answer ``result``. A ``completed`` wait is not called: the
    request is finished here, and ``result`` returned as it is."""
    if wait is completed:
        if request.fua:
            device.flush()
        return result

    def finish() -> MapResult:
        wait()
        if request.fua:
            device.flush()
        return result

    return finish


class Target(ABC):
    """One table line at run time. ``map`` performs a request that lies wholly inside it."""

    def __init__(self, start: int, length: int) -> None:
        self.start = start
        self.length = length

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def prompt(self) -> bool:
        """``map`` returns without waiting on another thread, a timer or the network."""
        return True

    @abstractmethod
    def map(self, request: Request, context: MapContext) -> MapResult: ...

    def submit(self, request: Request, context: MapContext) -> Started:
        """Start ``request`` and return what finishes it (waits for the device, and what
        must follow it: a read's decryption, a FUA write's flush), so that a dispatcher can
        put a whole batch on the device before it waits; or its ``MapResult`` when it is
        done already (nothing to wait for). Default: ``map`` at once."""
        return self.map(request, context)

    def flush(self) -> None:  # noqa: B027 - optional hook, like a target_type without .flush
        """Make completed writes durable; targets with no device have nothing to do."""

    def status(self) -> str:
        """``dmsetup status`` arguments (STATUSTYPE_INFO)."""
        return ""

    def wipe(self) -> None:  # noqa: B027 - optional hook: only crypt holds keys
        """Forget key material (remove, table swap)."""
