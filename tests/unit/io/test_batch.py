"""``app.io.batch.submit``: a batch started on the event loop when nothing in it can wait,
else one executor job."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.dm.volume import Volume
from app.io.batch import submit
from app.io.executor import IoExecutor
from app.io.ops import Io
from app.storage.memory import MemoryStore
from tests.support.volumes import SECTORS, make_volume

pytestmark = pytest.mark.anyio


@pytest.fixture
def volume() -> Iterator[Volume]:
    vol = make_volume(MemoryStore(SECTORS * 512), plug_window_us=0)
    yield vol
    vol.remove()


@pytest.fixture
def stopped() -> IoExecutor:
    """An executor that runs nothing: what completes was done on the event loop."""
    executor = IoExecutor()
    executor.shutdown()
    return executor


async def test_whole_block_io_on_a_prompt_volume_completes_on_the_loop(
    volume: Volume, stopped: IoExecutor
) -> None:
    write = Io.write(0, memoryview(b"\x07" * 4096))
    await submit(stopped, volume, [write], inline=True)
    read = Io.read(0, memoryview(bytearray(4096)))
    await submit(stopped, volume, [read], inline=True)
    assert (write.error, read.error) == (None, None)
    assert bytes(read.buffer or b"") == b"\x07" * 4096


async def test_a_partial_write_is_left_to_a_worker(volume: Volume, stopped: IoExecutor) -> None:
    with pytest.raises(RuntimeError, match="shut down"):
        await submit(stopped, volume, [Io.write(10, memoryview(b"x" * 5))], inline=True)


async def test_a_batch_not_inline_runs_on_a_worker(volume: Volume) -> None:
    executor = IoExecutor()
    try:
        write = Io.write(10, memoryview(b"x" * 5))
        await submit(executor, volume, [write], inline=False)
        assert write.error is None
        assert volume.read(10, 5) == b"x" * 5
    finally:
        executor.shutdown()
