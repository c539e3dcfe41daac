"""Backing stores pass the block device conformance suite, plus what only stores promise."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.errors import DeviceClaimed
from app.storage.file import FileStore
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
