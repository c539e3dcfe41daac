"""Backing stores pass the block device conformance suite, plus what only stores promise."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path

import pytest

from app.errors import DeviceClaimed
from app.storage.file import WRITE_CHUNK, FileStore
from app.storage.memory import MemoryStore
from tests.support.conformance import SIZE, BlockDeviceTests


class TestFileStore(BlockDeviceTests[FileStore]):
    @pytest.fixture
    def device(self, tmp_path: Path) -> Iterator[FileStore]:
        file_store = FileStore(tmp_path / "dev.img", SIZE, create=True)
        yield file_store
        file_store.close()

    def test_file_is_sparse_until_written(self, device: FileStore) -> None:
        assert device.allocated_bytes() < SIZE
        device.write(0, b"x" * 65536)
        assert device.allocated_bytes() >= 65536

    def test_discard_punches_a_hole(self, device: FileStore) -> None:
        device.write(0, b"x" * 65536)
        before = device.allocated_bytes()
        device.discard(0, 65536)
        assert device.allocated_bytes() < before

    def test_big_writes_reach_the_file_in_pieces_of_at_most_write_chunk(
        self, device: FileStore
    ) -> None:
        """No system call writes more than WRITE_CHUNK (the kernel sizes page-cache folios by
        it), and the pieces land whole and in order, from one buffer or several: a piece
        spans segments (one per segment would make 6 calls here, not 4)."""
        data = os.urandom(3 * WRITE_CHUNK + 4096)
        before = write_calls()
        device.write(8192, data)
        assert write_calls() - before == 4  # 3 whole chunks and the rest, each its own call
        assert device.read(8192, len(data)) == data

        cuts = [0, 5000, 5000 + WRITE_CHUNK + 1, 2 * WRITE_CHUNK + 7000, len(data)]
        reversed_data = data[::-1]
        scattered = [reversed_data[a:b] for a, b in pairwise(cuts)]  # separate bytes objects
        before = write_calls()
        device.writev(0, scattered)
        assert write_calls() - before == 4
        assert device.read(0, len(data)) == reversed_data

        adjacent = [memoryview(data)[a:b] for a, b in pairwise(cuts)]  # slices of one buffer
        before = write_calls()
        device.writev(4096, adjacent)
        assert write_calls() - before == 4
        assert device.read(4096, len(data)) == data

    def test_writev_joins_segments_adjacent_in_memory_into_one_iovec_entry(
        self, device: FileStore
    ) -> None:
        """Crypt's outputs are slices of one buffer: 2048 of them are one entry, one call;
        2048 scattered ones pass IOV_MAX (1024 entries) and take two."""
        data = os.urandom(2 * 2048 * 16)
        adjacent = [memoryview(data)[i : i + 16] for i in range(0, 2048 * 16, 16)]
        scattered = [memoryview(data)[i : i + 16] for i in range(0, len(data), 32)]
        before = write_calls()
        device.writev(0, adjacent)
        assert write_calls() - before == 1
        assert device.read(0, 2048 * 16) == data[: 2048 * 16]
        before = write_calls()
        device.writev(0, scattered)
        assert write_calls() - before == 2
        assert device.read(0, 2048 * 16) == b"".join(scattered)

    def test_readv_into_is_one_read_for_adjacent_segments_and_iov_max_per_call(
        self, device: FileStore
    ) -> None:
        data = os.urandom(2048 * 16)
        device.write(0, data)
        into = bytearray(2 * len(data))
        adjacent = [memoryview(into)[i : i + 16] for i in range(0, len(data), 16)]
        assert reads_by(lambda: device.readv_into(0, adjacent)) == 1
        assert into[: len(data)] == data
        into = bytearray(2 * len(data))
        scattered = [memoryview(into)[i : i + 16] for i in range(0, len(into), 32)]
        assert reads_by(lambda: device.readv_into(0, scattered)) == 2
        assert b"".join(scattered) == data

    def test_vectored_io_beyond_the_end_says_so_and_touches_nothing(
        self, device: FileStore
    ) -> None:
        with pytest.raises(ValueError, match=rf"range {SIZE - 512}\+1024 is outside the device"):
            device.writev(SIZE - 512, [b"x" * 512, b"y" * 512])
        assert device.read(SIZE - 512, 512) == bytes(512)
        into = bytearray(b"?" * 1024)
        with pytest.raises(ValueError, match="outside the device"):
            device.readv_into(SIZE, [memoryview(into)[:512], memoryview(into)[512:]])
        assert into == b"?" * 1024

    def test_read_into_reads_zeros_past_the_end_of_a_file_cut_short(
        self, device: FileStore
    ) -> None:
        """A device file truncated under the store reads as the device would: zeros past it."""
        device.write(SIZE - 8192, b"d" * 8192)
        os.truncate(device.path, SIZE - 1024)
        into = bytearray(b"?" * 4096)
        device.read_into(SIZE - 4096, memoryview(into))
        assert into == b"d" * 3072 + bytes(1024)

    def test_read_into_refuses_a_range_past_the_end_before_looking_at_the_buffer(
        self, device: FileStore
    ) -> None:
        """The range's ValueError, as from every store: not the buffer's error, not an
        overflow."""
        read_only = memoryview(bytes(512))
        with pytest.raises(ValueError, match=rf"range {SIZE}\+512 is outside the device"):
            device.read_into(SIZE, read_only)
        with pytest.raises(ValueError, match=r"range 9223372036854775808\+512 is outside"):
            device.read_into(2**63, memoryview(bytearray(512)))
        with pytest.raises(BufferError):
            device.read_into(0, read_only)

    def test_a_failed_write_raises_oserror(self, device: FileStore) -> None:
        read_only = os.open(device.path, os.O_RDONLY)
        os.dup2(read_only, device._fd)  # the store's descriptor, now open read-only
        os.close(read_only)
        with pytest.raises(OSError, match="Bad file descriptor") as raised:
            device.write(0, b"x" * 4096)
        assert raised.value.errno == errno.EBADF
        with pytest.raises(OSError, match="Bad file descriptor") as raised:
            device.writev(0, [b"x" * 4096, b"y" * 4096])
        assert raised.value.errno == errno.EBADF

    def test_a_failed_read_raises_oserror(self, device: FileStore) -> None:
        write_only = os.open(device.path, os.O_WRONLY)
        os.dup2(write_only, device._fd)
        os.close(write_only)
        with pytest.raises(OSError, match="Bad file descriptor") as raised:
            device.readv_into(0, [memoryview(bytearray(512)), memoryview(bytearray(512))])
        assert raised.value.errno == errno.EBADF


def write_calls() -> int:
    """Write system calls this thread has made (the kernel's I/O accounting)."""
    return thread_io("syscw")


def reads_by(action: Callable[[], object]) -> int:
    """Read system calls ``action`` makes, less those reading the count itself takes."""
    first = thread_io("syscr")
    second = thread_io("syscr")
    action()
    return thread_io("syscr") - 2 * second + first


def thread_io(field: str) -> int:
    for line in Path("/proc/thread-self/io").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/thread-self/io")


class TestFileStoreClaim:
    """``claim`` is an exclusive flock: one holder per device file, gone with its process."""

    def test_a_second_claim_on_the_same_file_is_refused_until_released(
        self, tmp_path: Path
    ) -> None:
        first = FileStore(tmp_path / "dev.img", SIZE, create=True)
        second = FileStore(tmp_path / "dev.img", SIZE)
        try:
            first.claim()
            first.claim()  # again: still ours
            with pytest.raises(DeviceClaimed):
                second.claim(take_over=True)  # a live holder cannot be fenced off a file
            first.release()
            second.claim()
            with pytest.raises(DeviceClaimed):
                first.claim()
        finally:
            first.close()
            second.close()

    def test_a_dead_holders_claim_is_gone(self, tmp_path: Path) -> None:
        path = tmp_path / "dev.img"
        FileStore(path, SIZE, create=True).close()
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
                "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
                str(path),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        store = FileStore(path, SIZE)
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline() == b"held\n"
            with pytest.raises(DeviceClaimed):
                store.claim(take_over=True)
            holder.kill()
            holder.communicate()
            store.claim(take_over=True)
        finally:
            holder.kill()
            holder.communicate()
            store.close()


class TestMemoryStore(BlockDeviceTests[MemoryStore]):
    @pytest.fixture
    def device(self) -> MemoryStore:
        return MemoryStore(SIZE)
