"""What targets map onto beyond plain stores: a timed device and a stacked volume conform too."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.dm.timed import TimedDevice
from app.dm.volume import Volume
from app.engine.clock import DeviceTimer
from app.engine.presets import DEVICE_MODELS
from app.errors import RangeNotSatisfiable
from app.storage.memory import MemoryStore
from tests.support.conformance import SIZE, BlockDeviceTests, read
from tests.support.keys import XTS_KEY
from tests.support.volumes import make_volume


class TestTimedDevice(BlockDeviceTests[TimedDevice]):
    @pytest.fixture
    def device(self) -> TimedDevice:
        return TimedDevice(MemoryStore(SIZE), DeviceTimer(DEVICE_MODELS["sdcard-bbb"]))

    def test_every_io_is_charged_to_the_model_clock(self, device: TimedDevice) -> None:
        device.write(0, bytes(4096))
        device.readv_into(0, [memoryview(bytearray(512)), memoryview(bytearray(512))])
        device.flush()
        ios = device.timer.snapshot()["ios"]
        assert (ios["write"], ios["read"], ios["flush"]) == (1, 1, 1)

    def test_submitted_io_is_charged_once_done(self, device: TimedDevice) -> None:
        device.submit_writev(0, [bytes(4096)])()
        device.submit_readv(0, [memoryview(bytearray(512)), memoryview(bytearray(512))])()
        ios = device.timer.snapshot()["ios"]
        assert (ios["write"], ios["read"]) == (1, 1)


class TestStackedVolume(BlockDeviceTests[Volume]):
    """``top`` (linear) over ``mid`` (crypt, allow_discards) over a memory store."""

    out_of_range = RangeNotSatisfiable
    unwritten_reads_zeros = False

    @pytest.fixture
    def store(self) -> MemoryStore:
        return MemoryStore(SIZE)

    @pytest.fixture
    def device(self, store: MemoryStore) -> Iterator[Volume]:
        sectors = SIZE // 512
        mid = make_volume(
            {"pv": store},
            f"0 {sectors} crypt aes-xts-plain64 {XTS_KEY} 0 pv 0 1 allow_discards",
            name="mid",
        )
        top = make_volume({"mid": mid}, f"0 {sectors} linear /dev/mapper/mid 0", name="top")
        yield top
        top.remove()
        mid.remove()

    def test_the_store_below_holds_ciphertext(self, device: Volume, store: MemoryStore) -> None:
        device.write(0, b"p" * 4096)
        assert read(store, 0, 4096) != b"p" * 4096
        assert read(device, 0, 4096) == b"p" * 4096
