"""Restore on start: every recorded device opened, every recorded volume rebuilt as it
was (state, tables, event number), a stacked volume after the volumes it maps.

Only a single node restores everything; a cluster node opens the devices and adopts
volumes as it takes their leases (``app.cluster``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.dm.stacking import stacking_order
from app.errors import InvalidState

if TYPE_CHECKING:
    from app.control.lifecycle import Control


def restore(control: Control) -> None:
    with control.records.transaction() as records:
        devices = records.devices()
        stored = {volume.name: volume for volume in records.volumes()}
    for device in devices:
        control.catalog.open(device)
    order, stranded = stacking_order(
        {name: [t for t in (v.live, v.inactive) if t is not None] for name, v in stored.items()}
    )
    if stranded:
        raise InvalidState("cannot restore volumes mapping missing volumes: " + ", ".join(stranded))
    for name in order:
        control.serve(stored[name])
