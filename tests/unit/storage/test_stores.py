"""Backing stores pass the block device conformance suite, plus what only stores promise."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest

from app.errors import DeviceClaimed
from app.storage import file as file_module
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
        self, device: FileStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """No system call writes more than WRITE_CHUNK (the kernel sizes page-cache folios by
        it), and the pieces land whole and in order, from one buffer or several."""
        data = os.urandom(3 * WRITE_CHUNK + 4096)
        before = write_calls()
        device.write(8192, data)
        assert write_calls() - before == 4  # 3 whole chunks and the rest, each its own call
        assert device.read(8192, len(data)) == data

        lengths: list[int] = []
        real_pwritev = os.pwritev

        def pwritev(fd: int, views: list[memoryview], offset: int) -> int:
            lengths.append(sum(len(view) for view in views))
            return real_pwritev(fd, views, offset)

        monkeypatch.setattr(file_module.os, "pwritev", pwritev)
        cuts = [0, 5000, 5000 + WRITE_CHUNK + 1, 2 * WRITE_CHUNK + 7000, len(data)]
        reversed_data = data[::-1]
        device.writev(0, [reversed_data[a:b] for a, b in pairwise(cuts)])
        assert device.read(0, len(data)) == reversed_data
        assert lengths == [WRITE_CHUNK] * 3 + [4096]

    def test_a_failed_write_raises_oserror(self, device: FileStore) -> None:
        read_only = os.open(device.path, os.O_RDONLY)
        os.dup2(read_only, device._fd)  # the store's descriptor, now open read-only
        os.close(read_only)
        with pytest.raises(OSError, match="Bad file descriptor") as raised:
            device.write(0, b"x" * 4096)
        assert raised.value.errno == errno.EBADF


def write_calls() -> int:
    """Write system calls this thread has made (the kernel's I/O accounting)."""
    for line in Path("/proc/thread-self/io").read_text().splitlines():
        if line.startswith("syscw:"):
            return int(line.split()[1])
    raise AssertionError("no syscw in /proc/thread-self/io")


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
