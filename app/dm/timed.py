"""A backing device charged to its device model's virtual clock on every I/O."""

from __future__ import annotations

from collections.abc import Sequence

from typing_extensions import Buffer

from app.dm.targets.base import BlockDevice
from app.engine.clock import DeviceTimer
from app.engine.model import DeviceOp
from app.vocab import Wait


class TimedDevice:
    """Wraps a ``BlockDevice`` so modelled storage time accrues beside the engine's."""

    def __init__(self, device: BlockDevice, timer: DeviceTimer) -> None:
        self.device = device
        self.timer = timer

    @property
    def size(self) -> int:
        return self.device.size

    @property
    def prompt(self) -> bool:
        """A paced model sleeps out the modelled time."""
        return self.device.prompt and not self.timer.pacing

    @property
    def queue_depth(self) -> int:
        return self.timer.model.queue_depth

    def read_into(self, offset: int, buffer: memoryview) -> None:
        self.device.read_into(offset, buffer)
        self.timer.account("read", len(buffer))

    def write(self, offset: int, data: Buffer) -> None:
        self.device.write(offset, data)
        self.timer.account("write", memoryview(data).nbytes)

    def readv_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        self.device.readv_into(offset, buffers)
        self.timer.account("read", sum(memoryview(buffer).nbytes for buffer in buffers))

    def writev(self, offset: int, buffers: Sequence[Buffer]) -> None:
        self.device.writev(offset, buffers)
        self.timer.account("write", sum(memoryview(buffer).nbytes for buffer in buffers))

    def submit_readv(self, offset: int, buffers: Sequence[memoryview]) -> Wait:
        wait = self.device.submit_readv(offset, buffers)
        return self._accounted(wait, "read", buffers)

    def submit_writev(self, offset: int, buffers: Sequence[Buffer]) -> Wait:
        wait = self.device.submit_writev(offset, buffers)
        return self._accounted(wait, "write", buffers)

    def _accounted(self, wait: Wait, op: DeviceOp, buffers: Sequence[Buffer]) -> Wait:
        """Time accrues for I/O that succeeded, as in the synchronous calls."""
        nbytes = sum(memoryview(buffer).nbytes for buffer in buffers)

        def accounted() -> None:
            wait()
            self.timer.account(op, nbytes)

        return accounted

    def flush(self) -> None:
        self.device.flush()
        self.timer.account("flush", 0)

    def discard(self, offset: int, length: int) -> None:
        self.device.discard(offset, length)

    def write_zeroes(self, offset: int, length: int) -> None:
        self.device.write_zeroes(offset, length)
        self.timer.account("write", length)
