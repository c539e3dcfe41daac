"""Sparse files under the data directory, driven with pread/pwrite on one descriptor."""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import os
from collections.abc import Sequence
from pathlib import Path

from typing_extensions import Buffer

from app import _native
from app.errors import DeviceClaimed
from app.storage.base import BackingStore
from app.vocab import Wait, completed

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


#: The most bytes one ``pwrite``/``pwritev`` writes. Linux sizes a file's page-cache folios
#: by the length of the write that creates them (ext4 from 6.16 on): a 1 MiB write leaves a
#: 1 MiB folio, allocating it needs high-order pages, and every later 4 KiB write into it
#: walks its 256 buffer heads (``ext4_block_write_begin``), which tripled the kernel's
#: share of a random 4 KiB write. Pieces of 128 KiB keep folios small for 8 system calls
#: per MiB instead of one, made in one native call (one GIL round trip, not 8).
WRITE_CHUNK = 128 << 10


class FileStore(BackingStore):
    """A backing device file; pread/pwrite are thread-safe on a shared descriptor."""

    prompt = True

    def __init__(self, path: Path, size: int, *, create: bool = False) -> None:
        self.path = path
        self._size = size
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        self._fd = os.open(path, flags, 0o600)
        if create or os.fstat(self._fd).st_size < size:
            os.ftruncate(self._fd, size)

    @property
    def size(self) -> int:
        return self._size

    def read_into(self, offset: int, buffer: memoryview) -> None:
        # Before the native call: check_range's error even for a read-only buffer or a huge offset.
        if offset < 0 or offset + len(buffer) > self._size:
            self.check_range(offset, len(buffer))
        _native.preadv_into(self._fd, (buffer,), offset, self._size)

    def write(self, offset: int, data: Buffer) -> None:
        _native.pwritev_chunks(self._fd, (data,), offset, WRITE_CHUNK, self._size)

    def readv_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        _native.preadv_into(self._fd, buffers, offset, self._size)

    def writev(self, offset: int, buffers: Sequence[Buffer]) -> None:
        _native.pwritev_chunks(self._fd, buffers, offset, WRITE_CHUNK, self._size)

    # The synchronous defaults without their call of readv_into/writev: once per request.

    def submit_readv(self, offset: int, buffers: Sequence[memoryview]) -> Wait:
        _native.preadv_into(self._fd, buffers, offset, self._size)
        return completed

    def submit_writev(self, offset: int, buffers: Sequence[Buffer]) -> Wait:
        _native.pwritev_chunks(self._fd, buffers, offset, WRITE_CHUNK, self._size)
        return completed

    def flush(self) -> None:
        os.fsync(self._fd)

    def claim(self, *, take_over: bool = False) -> None:
        """An exclusive ``flock`` on the device file. A file offers no way to fence a live
        holder, so ``take_over`` changes nothing: a process that is alive (even stopped)
        keeps its lock, and the kernel drops a dead one's. Taking it again is a no-op."""
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DeviceClaimed(
                f"device {self.path.stem} is claimed by another live process"
            ) from None

    def release(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def discard(self, offset: int, length: int) -> None:
        self.check_range(offset, length)
        if length == 0:
            return
        mode = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
        if _libc.fallocate(self._fd, mode, offset, length) != 0:
            errno = ctypes.get_errno()
            if errno not in (95,):  # EOPNOTSUPP: fall back to writing zeros
                raise OSError(errno, os.strerror(errno), str(self.path))
            self.write(offset, bytes(length))

    def allocated_bytes(self) -> int:
        return os.fstat(self._fd).st_blocks * 512

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
