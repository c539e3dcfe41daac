"""The ``BackingStore`` interface: byte-addressed, sector-aligned I/O on one backing device."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar, Protocol, TypeVar

from typing_extensions import Buffer

from app.vocab import Wait, completed


class _Closable(Protocol):
    def close(self) -> object: ...


_ClosableT = TypeVar("_ClosableT", bound=_Closable)


def close_all(handles: dict[str, _ClosableT]) -> None:
    """Close every handle an owner holds (stores, pool I/O contexts) and forget them."""
    for handle in handles.values():
        handle.close()
    handles.clear()


class BackingStore(ABC):
    """A backing device. Offsets and lengths are bytes; callers keep them sector-aligned."""

    #: Every call returns without waiting on another thread, a timer or the network (local
    #: memory or the page cache): a caller may run it on an event loop.
    prompt: ClassVar[bool] = False

    @property
    @abstractmethod
    def size(self) -> int: ...

    @abstractmethod
    def read_into(self, offset: int, buffer: memoryview) -> None:
        """Fill ``buffer`` from ``offset``; holes read as zeros."""

    @abstractmethod
    def write(self, offset: int, data: Buffer) -> None:
        """Write ``data`` at ``offset``; visible to readers once it returns, durable after ``flush``."""

    @abstractmethod
    def flush(self) -> None:
        """Make every completed write durable (fsync)."""

    @abstractmethod
    def discard(self, offset: int, length: int) -> None:
        """Deallocate the range; it then reads as zeros."""

    def write_zeroes(self, offset: int, length: int) -> None:
        """Make the range read as zeros; stores with a cheaper way than writing them override."""
        self.check_range(offset, length)
        chunk = bytes(min(length, 1 << 20))
        end = offset + length
        while offset < end:
            count = min(len(chunk), end - offset)
            self.write(offset, memoryview(chunk)[:count])
            offset += count

    @abstractmethod
    def allocated_bytes(self) -> int: ...

    @abstractmethod
    def close(self) -> None: ...

    def claim(self, *, take_over: bool = False) -> None:
        """Take exclusive ownership of the device for this process (a cluster node serving a
        volume on it); ``take_over`` first fences any other holder, where the store can.
        A holder that cannot be fenced makes it raise ``DeviceClaimed``. Default: nothing
        to claim (a store only this process can reach)."""
        return None

    def release(self) -> None:
        """Give up what ``claim`` took; another process may claim it then."""
        return None

    def readv_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        """Fill consecutive ``buffers`` from ``offset``: one device I/O for a whole request."""
        for buffer in buffers:
            self.read_into(offset, buffer)
            offset += len(buffer)

    def writev(self, offset: int, buffers: Sequence[Buffer]) -> None:
        """Write consecutive ``buffers`` at ``offset``: one device I/O for a whole request."""
        for buffer in buffers:
            view = memoryview(buffer).cast("B")
            self.write(offset, view)
            offset += len(view)

    def submit_readv(self, offset: int, buffers: Sequence[memoryview]) -> Wait:
        """Start ``readv_into``; the buffers are filled once the returned wait returns.

        Lets a dispatcher put a whole batch of requests on the device before waiting for
        any. Default: the read is done before this returns (errors raise here)."""
        self.readv_into(offset, buffers)
        return completed

    def submit_writev(self, offset: int, buffers: Sequence[Buffer]) -> Wait:
        """Start ``writev``; done (visible to readers) once the returned wait returns.
        The caller may reuse ``buffers`` as soon as this returns. Default: synchronous."""
        self.writev(offset, buffers)
        return completed

    def read(self, offset: int, length: int) -> bytearray:
        buffer = bytearray(length)
        self.read_into(offset, memoryview(buffer))
        return buffer

    def check_range(self, offset: int, length: int) -> None:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise ValueError(f"range {offset}+{length} is outside the device ({self.size} bytes)")
