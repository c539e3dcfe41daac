"""Who maps whom: the one answer for rename, remove, device delete, cycles, restart order,
and what a cluster node must keep together (a *stack*).

A volume's tables (live and inactive) map devices and other volumes. As in the
kernel, where ``dmsetup load`` opens a table's devices before it is ever
resumed, an inactive table holds its devices exactly as a live one does: a
volume or device named by either table may not be renamed or removed, and its
open count counts both. Pure: it reads tables, never SQL or I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from app.dm.table import DeviceRef, Table


class HasTables(Protocol):
    def tables(self) -> list[Table]:
        """The live table (if any), then the inactive one (if any)."""
        ...


class StackingGraph:
    """The edges from each volume to what its live and inactive tables map.

    ``volumes`` is the control plane's own dict, read at every question, so the
    graph never goes stale as volumes are created, loaded, renamed and removed.
    """

    def __init__(self, volumes: Mapping[str, HasTables]) -> None:
        self._volumes = volumes

    def users_of(self, key: str) -> list[str]:
        """Volumes whose live or inactive table maps ``key`` (a ``DeviceRef.key``)."""
        return sorted(
            name
            for name, volume in self._volumes.items()
            if any(key in table.devices() for table in volume.tables())
        )

    def volume_users(self, name: str) -> list[str]:
        return self.users_of(DeviceRef("volume", name, "").key)

    def open_count(self, name: str) -> int:
        """Tables (live or inactive) that map volume ``name``: each holds it open."""
        key = DeviceRef("volume", name, "").key
        return sum(
            key in table.devices() for volume in self._volumes.values() for table in volume.tables()
        )

    def bottom_up(self) -> list[str]:
        """Every volume, each after every volume its tables map (a clean stop drops them in
        the reverse order, so no volume goes while another still maps it)."""
        order, stranded = stacking_order({name: v.tables() for name, v in self._volumes.items()})
        return order + stranded

    def stack_of(self, name: str) -> list[str]:
        """Every volume linked to ``name`` by mapping, either way, bottom-up: what must be
        served by one node, so what moves together (a volume mapping two others takes
        both along)."""
        stack = {name}
        pending = [name]
        while pending:
            current = pending.pop()
            linked = set(self.volume_users(current))
            volume = self._volumes.get(current)
            if volume is not None:
                linked.update(*(table.volume_names() for table in volume.tables()))
            for other in linked - stack:
                stack.add(other)
                pending.append(other)
        order, stranded = stacking_order(
            {member: self._volumes[member].tables() for member in stack if member in self._volumes}
        )
        return order + stranded

    def would_cycle(self, name: str, table: Table) -> bool:
        """Would giving volume ``name`` this table make it map onto itself, at any depth?"""
        seen: set[str] = set()
        pending = list(table.volume_names())
        while pending:
            current = pending.pop()
            if current == name:
                return True
            if current in seen:
                continue
            seen.add(current)
            other = self._volumes.get(current)
            if other is not None:
                for other_table in other.tables():
                    pending.extend(other_table.volume_names())
        return False


def stacking_order(tables: Mapping[str, Iterable[Table]]) -> tuple[list[str], list[str]]:
    """Volumes in an order where each comes after every volume its tables map.

    Returns ``(order, stranded)``: ``stranded`` names volumes whose tables map a
    volume that does not exist (or a cycle), which no order can build.
    """
    needs = {
        name: set().union(*(table.volume_names() for table in volume_tables))
        for name, volume_tables in tables.items()
    }
    order: list[str] = []
    built: set[str] = set()
    pending = dict(needs)
    while True:
        ready = sorted(name for name, needed in pending.items() if needed <= built)
        if not ready:
            return order, sorted(pending)
        for name in ready:
            order.append(name)
            built.add(name)
            del pending[name]
