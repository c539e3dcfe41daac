"""One conformance suite for everything a target maps onto (``BlockDevice``).

A file store, the memory store, a timed device and a stacked volume all
subclass ``BlockDeviceTests`` and provide a ``device`` fixture of ``SIZE``
bytes, as zarr-python's store implementations subclass its ``StoreTests``.
Offsets and lengths stay sector-aligned: that is what targets send.
"""

from __future__ import annotations

import threading
from typing import ClassVar, Generic, TypeVar

import pytest

from app.dm.targets import BlockDevice

SIZE = 1 << 20
D = TypeVar("D", bound=BlockDevice)


def read(device: BlockDevice, offset: int, length: int) -> bytes:
    buffer = bytearray(length)
    device.read_into(offset, memoryview(buffer))
    return bytes(buffer)


class BlockDeviceTests(Generic[D]):
    out_of_range: ClassVar[type[Exception]] = ValueError
    """What I/O past the end raises."""
    unwritten_reads_zeros: ClassVar[bool] = True
    """False under crypt: never-written and discarded sectors read as decrypted zeros."""

    @pytest.fixture
    def device(self) -> D:
        raise NotImplementedError

    def test_size_is_what_it_was_made_with(self, device: D) -> None:
        assert device.size == SIZE

    def test_a_new_device_reads_zeros_or_what_zeros_decrypt_to(self, device: D) -> None:
        first = read(device, 4096, 512)
        assert (first == bytes(512)) == self.unwritten_reads_zeros
        assert read(device, 4096, 512) == first

    def test_written_bytes_read_back(self, device: D) -> None:
        device.write(512, b"abc" * 512)
        assert read(device, 512, 1536) == b"abc" * 512

    def test_the_last_sector_is_writable(self, device: D) -> None:
        device.write(SIZE - 512, b"z" * 512)
        assert read(device, SIZE - 512, 512) == b"z" * 512

    def test_vectored_io_is_one_contiguous_range(self, device: D) -> None:
        device.writev(1024, [b"a" * 512, memoryview(b"b" * 1024), bytearray(b"c" * 512)])
        assert read(device, 1024, 2048) == b"a" * 512 + b"b" * 1024 + b"c" * 512
        first, second = bytearray(1536), bytearray(512)
        device.readv_into(1024, [memoryview(first), memoryview(second)])
        assert first == b"a" * 512 + b"b" * 1024
        assert second == b"c" * 512

    def test_discard_touches_only_its_range(self, device: D) -> None:
        device.write(0, b"x" * 8192)
        device.discard(0, 4096)
        assert read(device, 4096, 4096) == b"x" * 4096
        discarded = read(device, 0, 4096)
        assert discarded != b"x" * 4096
        assert (discarded == bytes(4096)) == self.unwritten_reads_zeros

    def test_write_zeroes_zeroes_only_its_range(self, device: D) -> None:
        device.write(0, b"w" * 8192)
        device.write_zeroes(512, 1024)
        assert read(device, 0, 2048) == b"w" * 512 + bytes(1024) + b"w" * 512

    def test_flushed_writes_still_read_back(self, device: D) -> None:
        device.write(65536, b"f" * 4096)
        device.flush()
        assert read(device, 65536, 4096) == b"f" * 4096

    def test_concurrent_writes_to_disjoint_ranges_all_land(self, device: D) -> None:
        def writer(index: int) -> None:
            for round_ in range(8):
                device.write(index * 8192 + round_ * 512, bytes([index + 1]) * 512)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for index in range(8):
            assert read(device, index * 8192, 4096) == bytes([index + 1]) * 4096

    def test_submitted_writes_are_read_back_once_waited_for(self, device: D) -> None:
        waits = [
            device.submit_writev(index * 8192, [bytes([index + 1]) * 4096, b"e" * 512])
            for index in range(8)
        ]
        for wait in waits:
            wait()
        for index in range(8):
            assert read(device, index * 8192, 4608) == bytes([index + 1]) * 4096 + b"e" * 512

    def test_submitted_reads_fill_their_segments_once_waited_for(self, device: D) -> None:
        pattern = bytes(range(256)) * 64  # 16 KiB, every 512-byte sector distinct
        device.write(0, pattern)
        segments = [bytearray(1024) for _ in range(16)]
        waits = [
            device.submit_readv(
                index * 2048, [memoryview(segments[2 * index]), memoryview(segments[2 * index + 1])]
            )
            for index in range(8)
        ]
        for wait in waits:
            wait()
        assert b"".join(segments) == pattern

    def test_a_submitted_write_no_longer_needs_its_buffers(self, device: D) -> None:
        """What lets a target hand over a request's ciphertext and reuse its buffers."""
        buffer = bytearray(b"k" * 4096)
        wait = device.submit_writev(0, [memoryview(buffer)])
        buffer[:] = b"?" * 4096
        wait()
        assert read(device, 0, 4096) == b"k" * 4096

    def test_submitted_io_beyond_the_end_is_refused(self, device: D) -> None:
        with pytest.raises(self.out_of_range):
            device.submit_writev(SIZE - 512, [b"x" * 1024])()
        with pytest.raises(self.out_of_range):
            device.submit_readv(SIZE, [memoryview(bytearray(512))])()

    def test_io_beyond_the_end_is_refused(self, device: D) -> None:
        with pytest.raises(self.out_of_range):
            device.write(SIZE - 512, b"x" * 1024)
        with pytest.raises(self.out_of_range):
            device.read_into(SIZE, memoryview(bytearray(512)))
