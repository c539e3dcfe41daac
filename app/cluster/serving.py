"""The serving set of a cluster node: the leases it holds, takes, gives up, and the
devices it claimed under them. The one place a node's lease state lives.

It is ``Control``'s guard (``app.control.guard.Guard``): a lifecycle write re-checks
the lease (and row-locks it) in its own transaction, a create takes the new volume's
first lease in the creating transaction, and each served volume's devices are claimed
(``BackingStore.claim``) so no other node can use them.

A lease is in at most one of these states:

- held: the volume is served here until ``Holding.deadline`` (``time.monotonic()``,
  measured from before the statement that granted it was sent);
- pending: taken, but a live previous holder still claims a device; renewed, retried
  every tick, the volume unserved (503) until the old owner lets go;
- leaving: being moved away (dropped here, still ours in SQL until handed over);
- released: given up when this node's Ceph client was blocklisted, left to the other
  nodes for one lease.

Renewal (``renewed``) and giving up (``let_go``) take no lock: a lifecycle call holding
the control lock (a suspend draining for seconds) must never delay them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from app.cluster.placement import served_elsewhere
from app.db.leases import Lease, Leases
from app.db.records import RecordsTx
from app.dm.volume import Volume
from app.errors import LeaseExpired, ReqcryptError, VolumeNotFound
from app.storage.registry import DeviceRegistry


@dataclass(frozen=True, slots=True)
class Holding:
    """A lease this node holds on ``volume``, and the local deadline of its I/O."""

    lease: Lease
    deadline: float
    volume: Volume


class ServingSet:
    shared = True

    def __init__(self, leases: Leases, stores: DeviceRegistry) -> None:
        self.leases = leases
        self.node = leases.node
        self.stores = stores
        self.held: dict[str, Holding] = {}
        """uuid: every volume this node serves."""
        self.pending: dict[str, Lease] = {}
        self.leaving: set[str] = set()
        self.released: dict[str, float] = {}
        """uuid: until when (``time.monotonic()``) it is left to the other nodes."""
        self._claimed: dict[str, set[str]] = {}
        """uuid: the devices claimed for that volume."""

    # ------------------------------------------------------------------ the guard

    def claim(self, uuid: str, devices: set[str], *, take_over: bool = False) -> None:
        mine = set().union(*self._claimed.values())
        taken: list[str] = []
        try:
            for name in sorted(devices - mine):
                self.stores.get(name).claim(take_over=take_over)
                taken.append(name)
        except BaseException:
            for name in taken:
                self.stores.get(name).release()
            raise
        self._claimed[uuid] = self._claimed.get(uuid, set()) | set(taken) | (devices & mine)

    def release(self, uuid: str, kept: set[str]) -> None:
        dropped = self._claimed.pop(uuid, set()) - kept
        if kept:
            self._claimed[uuid] = kept
        others = set().union(*self._claimed.values())
        opened = set(self.stores.names())
        for name in (dropped - others) & opened:
            self.stores.get(name).release()

    def claim_unmapped(self, device: str) -> None:
        self.stores.get(device).claim()  # a volume on another node maps it: claimed there

    def check(self, records: RecordsTx, volume: Volume) -> None:
        holding = self.held.get(volume.uuid)
        if holding is None or not records.hold_lease(volume.uuid, self.node, holding.lease.epoch):
            raise LeaseExpired(f"this node no longer holds the lease on volume {volume.name}")

    def own_new(self, records: RecordsTx, volume: Volume, started: float) -> Callable[[], None]:
        lease = records.own_new(volume.uuid, self.node, self.leases.lease_seconds)
        return lambda: self.hold(volume, lease, started + self.leases.lease_seconds)

    def forget(self, volume: Volume) -> None:
        self.release(volume.uuid, set())
        self.held.pop(volume.uuid, None)

    def not_served(self, name: str) -> ReqcryptError:
        owner = self.leases.owner_of(name)
        if owner is None:
            return VolumeNotFound(f"volume {name} not found")
        return served_elsewhere(name, owner.node)

    # ------------------------------------------------------------------ leases

    def hold(self, volume: Volume, lease: Lease, deadline: float) -> None:
        """Serve ``volume`` under ``lease``: it admits I/O until ``deadline``."""
        self.held[volume.uuid] = Holding(lease, deadline, volume)
        volume.hold_lease_until(deadline, lease.epoch)

    def holding(self, uuid: str) -> Holding | None:
        return self.held.get(uuid)

    def serves(self, uuid: str) -> bool:
        return uuid in self.held

    def asked(self) -> dict[str, int]:
        """uuid: epoch of every lease to renew (held and pending)."""
        asked = {uuid: holding.lease.epoch for uuid, holding in list(self.held.items())}
        asked.update({uuid: lease.epoch for uuid, lease in self.pending.items()})
        return asked

    def renewed(
        self, asked: Mapping[str, int], leases: Mapping[str, Lease], deadline: float
    ) -> list[Volume]:
        """Apply a renewal of ``asked``: extend what was renewed; end at once the lease
        deadline of what was not (its I/O refused) and return those volumes, to be dropped. A lease taken since the renewal was
        asked is left alone."""
        lost = []
        for uuid, holding in list(self.held.items()):
            if asked.get(uuid) != holding.lease.epoch or self.held.get(uuid) is not holding:
                continue  # taken since, or fenced by the deadline meanwhile (``expired``)
            lease = leases.get(uuid)
            if lease is not None:
                self.held[uuid] = Holding(lease, deadline, holding.volume)
                holding.volume.hold_lease_until(deadline, lease.epoch)
            else:
                self.held.pop(uuid, None)
                holding.volume.hold_lease_until(-math.inf)
                lost.append(holding.volume)
        self.pending = {uuid: leases[uuid] for uuid in self.pending if uuid in leases}
        return lost

    def expired(self, now: float) -> list[Volume]:
        """Stop holding every volume whose local deadline has passed (its I/O is refused
        already) and return them, to be dropped: without a renewal, this node fences
        itself and lets its devices go, whatever the database answers or fails to."""
        fenced = []
        for uuid, holding in list(self.held.items()):
            if holding.deadline < now and self.held.get(uuid) is holding:
                self.held.pop(uuid, None)
                holding.volume.hold_lease_until(-math.inf)
                fenced.append(holding.volume)
        return fenced

    def let_go(self, volume: Volume) -> Lease | None:
        """Stop ``volume``'s I/O at once and its lease with it (None: none was held)."""
        volume.hold_lease_until(-math.inf)
        holding = self.held.pop(volume.uuid, None)
        return None if holding is None else holding.lease
