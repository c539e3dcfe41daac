"""The ownership guard ``Control`` needs: which volumes this process may serve and write.

``Control`` calls it at fixed points of every lifecycle call and knows nothing of leases:
``SingleNode`` (the only process: everything is ours) or a cluster node's serving set
(``app.cluster.serving.ServingSet``: only what it holds a lease on) implements it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from app.db.records import RecordsTx
from app.dm.volume import Volume
from app.errors import ReqcryptError, VolumeNotFound


class Guard(Protocol):
    shared: bool
    """Other processes record devices in the same database: re-read them before a create."""

    def claim(self, uuid: str, devices: set[str], *, take_over: bool = False) -> None:
        """Claim for volume ``uuid`` the ``devices`` its tables map, so no other process
        uses them (``DeviceClaimed`` if a live one does; ``take_over`` fences a dead one).
        Nothing is claimed when it fails."""

    def release(self, uuid: str, kept: set[str]) -> None:
        """Release what ``uuid`` claimed that its tables no longer map (``kept``)."""

    def claim_unmapped(self, device: str) -> None:
        """Before a device is deleted: ``DeviceClaimed`` if another process maps it."""

    def check(self, records: RecordsTx, volume: Volume) -> None:
        """Inside a lifecycle transaction, before it writes: ``LeaseExpired`` if this
        process may no longer write for ``volume`` (held until the transaction ends)."""

    def own_new(self, records: RecordsTx, volume: Volume, started: float) -> Callable[[], None]:
        """Inside the creating transaction: make the new volume ours. Returns what to do
        once that transaction committed (``started``: before it began)."""

    def forget(self, volume: Volume) -> None:
        """``volume`` is no longer served here (removed, or dropped): release its claims."""

    def not_served(self, name: str) -> ReqcryptError:
        """Why a table cannot map volume ``name``, which this process does not serve."""


class SingleNode:
    """The only process on its database: it serves every volume, nobody else claims."""

    shared = False

    def claim(self, uuid: str, devices: set[str], *, take_over: bool = False) -> None:
        pass

    def release(self, uuid: str, kept: set[str]) -> None:
        pass

    def claim_unmapped(self, device: str) -> None:
        pass

    def check(self, records: RecordsTx, volume: Volume) -> None:
        pass

    def own_new(self, records: RecordsTx, volume: Volume, started: float) -> Callable[[], None]:
        return lambda: None

    def forget(self, volume: Volume) -> None:
        pass

    def not_served(self, name: str) -> ReqcryptError:
        return VolumeNotFound(f"volume {name} not found")
