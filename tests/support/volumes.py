"""Volumes built in process, as ``Control`` builds them, over stores the test holds."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from app.blk.tuning import Tuning
from app.dm.table import parse_table
from app.dm.targets.base import BlockDevice
from app.dm.volume import Volume
from app.engine.registry import EngineRegistry
from tests.support.keys import XTS_KEY

SECTORS = 2048


def make_volume(
    devices: BlockDevice | Mapping[str, BlockDevice],
    table: str | None = None,
    *,
    name: str = "v",
    suspend_wait_seconds: float = 0.2,
    **tuning: object,
) -> Volume:
    """Volume ``name`` loaded with ``table`` (aes-xts over ``SECTORS`` of ``pv`` if none)
    and resumed: each device the table names is ``devices[name]``, or ``devices`` itself
    if it is one store. A short suspend wait, so a test holding I/O fails fast."""
    volume = Volume(
        name,
        f"uuid-{uuid.uuid4().hex[:8]}",
        engine=EngineRegistry().engine("software"),
        tuning=Tuning(**tuning),  # type: ignore[arg-type]
        suspend_wait_seconds=suspend_wait_seconds,
    )
    volume.load(parse_table(table or f"0 {SECTORS} crypt aes-xts-plain64 {XTS_KEY} 0 pv 0"))
    if isinstance(devices, Mapping):
        volume.resume(lambda ref: devices[ref.name])
    else:
        volume.resume(lambda ref: devices)
    return volume
