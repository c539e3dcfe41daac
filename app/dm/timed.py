"""A backing device charged to its device model's virtual clock on every I/O."""

from __future__ import annotations

from typing_extensions import Buffer

from app.dm.targets.base import BlockDevice
from app.engine.clock import DeviceTimer


class TimedDevice:
    """Wraps a ``BlockDevice`` so modelled storage time accrues beside the engine's."""

    def __init__(self, device: BlockDevice, timer: DeviceTimer) -> None:
        self.device = device
        self.timer = timer

    @property
    def size(self) -> int:
        return self.device.size

    def read_into(self, offset: int, buffer: memoryview) -> None:
        self.device.read_into(offset, buffer)
        self.timer.account("read", len(buffer))

    def write(self, offset: int, data: Buffer) -> None:
        self.device.write(offset, data)
        self.timer.account("write", memoryview(data).nbytes)

    def flush(self) -> None:
        self.device.flush()
        self.timer.account("flush", 0)

    def discard(self, offset: int, length: int) -> None:
        self.device.discard(offset, length)
