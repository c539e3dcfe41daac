"""An in-memory store for tests and benchmarks that must not measure the disk."""

from __future__ import annotations

import threading

from typing_extensions import Buffer

from app.storage.base import BackingStore


class MemoryStore(BackingStore):
    prompt = True

    def __init__(self, size: int) -> None:
        self._data = bytearray(size)
        self._lock = threading.Lock()
        self.flushes = 0

    @property
    def size(self) -> int:
        return len(self._data)

    def read_into(self, offset: int, buffer: memoryview) -> None:
        self.check_range(offset, len(buffer))
        buffer[:] = self._data[offset : offset + len(buffer)]

    def write(self, offset: int, data: Buffer) -> None:
        view = memoryview(data).cast("B")
        self.check_range(offset, len(view))
        self._data[offset : offset + len(view)] = view

    def flush(self) -> None:
        with self._lock:
            self.flushes += 1

    def discard(self, offset: int, length: int) -> None:
        self.check_range(offset, length)
        self._data[offset : offset + length] = bytes(length)

    def allocated_bytes(self) -> int:
        return len(self._data)

    def close(self) -> None:
        self._data = bytearray()
