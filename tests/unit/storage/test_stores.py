"""Backing stores pass the block device conformance suite, plus what only stores promise."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.storage.file import FileStore
from app.storage.memory import MemoryStore
from tests.conformance import SIZE, BlockDeviceTests


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


class TestMemoryStore(BlockDeviceTests[MemoryStore]):
    @pytest.fixture
    def device(self) -> MemoryStore:
        return MemoryStore(SIZE)
