"""One conformance suite every backing store passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.storage.base import BackingStore
from app.storage.file import FileStore
from app.storage.memory import MemoryStore

SIZE = 1 << 20


class BackingStoreTests:
    @pytest.fixture
    def store(self, tmp_path: Path) -> BackingStore:
        raise NotImplementedError

    def test_a_new_store_reads_zeros(self, store: BackingStore) -> None:
        assert store.read(4096, 512) == bytes(512)

    def test_written_bytes_read_back(self, store: BackingStore) -> None:
        store.write(512, b"abc" * 512)
        assert store.read(512, 1536) == b"abc" * 512

    def test_vectored_io_is_one_contiguous_range(self, store: BackingStore) -> None:
        store.writev(1024, [b"a" * 512, memoryview(b"b" * 1024), bytearray(b"c" * 512)])
        assert store.read(1024, 2048) == b"a" * 512 + b"b" * 1024 + b"c" * 512
        first, second = bytearray(1536), bytearray(512)
        store.readv_into(1024, [memoryview(first), memoryview(second)])
        assert first == b"a" * 512 + b"b" * 1024
        assert second == b"c" * 512

    def test_discarded_range_reads_zeros(self, store: BackingStore) -> None:
        store.write(0, b"x" * 8192)
        store.discard(0, 4096)
        assert store.read(0, 8192) == bytes(4096) + b"x" * 4096

    def test_io_beyond_the_end_is_refused(self, store: BackingStore) -> None:
        with pytest.raises(ValueError, match="outside the device"):
            store.write(SIZE - 256, b"x" * 512)


class TestFileStore(BackingStoreTests):
    @pytest.fixture
    def store(self, tmp_path: Path) -> BackingStore:
        file_store = FileStore(tmp_path / "dev.img", SIZE, create=True)
        yield file_store  # type: ignore[misc]
        file_store.close()

    def test_file_is_sparse_until_written(self, store: BackingStore) -> None:
        assert store.allocated_bytes() < SIZE
        store.write(0, b"x" * 65536)
        assert store.allocated_bytes() >= 65536

    def test_discard_punches_a_hole(self, store: BackingStore) -> None:
        store.write(0, b"x" * 65536)
        before = store.allocated_bytes()
        store.discard(0, 65536)
        assert store.allocated_bytes() < before


class TestMemoryStore(BackingStoreTests):
    @pytest.fixture
    def store(self, tmp_path: Path) -> BackingStore:
        return MemoryStore(SIZE)
