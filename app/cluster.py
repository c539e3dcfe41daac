"""One node of a cluster: several ``reqcrypt serve`` sharing PostgreSQL and the devices.

Each volume is served by exactly one node, the holder of its lease
(``app.db.leases``). A background thread ticks every ``renew_interval``
(a third of the lease by default) and, in this order:

1. heartbeats (the ``nodes`` row other nodes place volumes and redirect by);
2. renews every lease it holds in one statement; a volume whose lease was not
   renewed is dropped at once without writing (``Control.renewed``), and every
   I/O on a volume is refused past the local deadline of its last renewal even
   if this thread is late (``DataPath.lease_deadline``) — a node frozen past its
   lease therefore never writes again for it;
3. takes every lease that is free, expired, or handed to it (``move``), claims
   the volume's devices with ``take_over`` and adopts the volume. A claim the
   store refuses (a file-backed device still locked by a stopped, not dead,
   previous owner) keeps the lease *pending*: renewed, retried every tick, the
   volume unserved (503) until the old owner notices and lets go.

A stacked volume (its table maps ``/dev/mapper/<lower>``) can only be served by
the node serving its lower volume, so a *stack* (``StackingGraph.stack_of``) lives
on one node: a scan takes free leases bottom-up, adopting an upper volume right
after its lower, and never takes an upper whose lower this node does not serve (it
waits for the node that takes the lower); a move hands over the whole stack; a
clean stop drops top-down.

A node whose Ceph client was blocklisted (another node broke one of its image
locks; it learns so at the first I/O the OSDs refuse, or at ``/readyz``) can write
to no image through that connection. Its next tick *fences* it: every volume
mapping an RBD device is fenced and its lease released at once (the other nodes
take them within a tick; nothing is flushed — nothing could be), the heartbeat
says not ready (no placement, no move here) and the scan skips RBD volumes. A
thread of its own drops those volumes, then opens a new Ceph connection (a new
client, not blocklisted) and every RBD device on it; from then on the node is
ready and takes RBD volumes again — except, for one lease, the ones it released:
those are the other nodes' to take first (a quick reconnect would otherwise race
them for every volume it just gave up). File-backed volumes are served throughout.

So a volume fails over within about ``lease_seconds + renew_interval`` of its
owner's death. Renewal never waits for the control plane's lock (a suspend may
hold it while it drains); adoption takes it only when free, and a dropped
volume's teardown waits for it in a thread of its own.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass

from app.control import Control
from app.db.leases import Lease, Leases, NodeLoad
from app.dm.stacking import stacking_order
from app.dm.table import Table, parse_table
from app.errors import DeviceClaimed, InvalidInput, ReqcryptError

log = logging.getLogger("reqcrypt.cluster")


@dataclass(slots=True)
class ClusterStats:
    takeovers: int = 0
    """Leases taken (a failover, a move's target, a start)."""
    leases_lost: int = 0
    """Volumes dropped because their lease could not be renewed in time."""
    claims_blocked: int = 0
    """Claims a live previous holder refused (each retry counts)."""
    rbd_fenced: int = 0
    """Leases released because this node's Ceph client was blocklisted."""
    reconnects: int = 0
    """New Ceph connections made after a blocklisting."""
    tick_failures: int = 0


class ClusterNode:
    def __init__(
        self,
        control: Control,
        leases: Leases,
        *,
        url: str,
        lease_seconds: float,
        renew_interval: float,
    ) -> None:
        self.control = control
        self.leases = leases
        self.node = leases.node
        self.url = url
        self.lease_seconds = lease_seconds
        self.renew_interval = renew_interval
        self.pending: dict[str, Lease] = {}
        """uuid: leases taken whose devices a live previous holder still claims."""
        self.leaving: set[str] = set()
        """uuid: volumes being moved away (dropped here, not yet handed over)."""
        self.stats = ClusterStats()
        self.last_heartbeat: float | None = None
        self.announced_ready = False
        """What the last heartbeat told placement (``nodes.ready``)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tick_lock = threading.Lock()
        self._reconnecting: threading.Thread | None = None
        self.released: dict[str, float] = {}
        """uuid: until when (``time.monotonic()``) this node leaves a lease it released
        when fenced to the other nodes."""

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """One tick before serving (adopt what is ours or free), then the thread."""
        self.tick()
        self._thread = threading.Thread(target=self._run, name="reqcrypt-leases", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """A clean stop: drop every volume durably and release its lease at once, so
        another node takes it in one tick instead of a lease."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.lease_seconds + 5)
        try:  # place nothing more here while this node still looks alive
            self.leases.heartbeat(self.url, ready=False)
        except Exception:
            log.exception("could not mark this node as stopping")
        with self._tick_lock:
            for name in reversed(self.control.stacking.bottom_up()):
                try:
                    lease = self.control.drop(name, graceful=True)
                    if lease is not None:
                        self.leases.release(lease.uuid, lease.epoch)
                except Exception:
                    log.exception("could not hand volume %s back cleanly", name)
            for lease in self.pending.values():
                self.leases.release(lease.uuid, lease.epoch)
            self.pending.clear()

    def _run(self) -> None:
        while not self._stop.wait(self.renew_interval):
            try:
                self.tick()
            except Exception:
                self.stats.tick_failures += 1
                log.exception("lease tick failed")

    # ------------------------------------------------------------------ tick

    @property
    def fenced(self) -> bool:
        """The Ceph client is blocklisted and not yet replaced: RBD devices are unusable."""
        ceph = self.control.devices.ceph
        return ceph is not None and ceph.blocklisted

    def tick(self) -> None:
        with self._tick_lock:
            started = time.monotonic()
            fenced = self.fenced
            self.leases.heartbeat(self.url, ready=not fenced)
            self.last_heartbeat = started
            self.announced_ready = not fenced
            if fenced:
                self._give_up_rbd()
            self._renew(started)
            self._take(started, rbd=not fenced)

    def _give_up_rbd(self) -> None:
        """Release the leases of every volume on an RBD device now, and reconnect (in a
        thread: the drops wait for the control lock) unless that is under way."""
        if self._reconnecting is not None and self._reconnecting.is_alive():
            return
        dropped = self.control.fence_rbd()
        for name, lease in dropped:
            if lease is not None:
                self.leases.release(lease.uuid, lease.epoch)
                self.released[lease.uuid] = time.monotonic() + self.lease_seconds
                self.stats.rbd_fenced += 1
                log.warning("volume %s: Ceph client blocklisted; lease released", name)
        self._reconnecting = threading.Thread(
            target=self._reconnect,
            args=([name for name, _ in dropped],),
            name="reqcrypt-reconnect",
            daemon=True,
        )
        self._reconnecting.start()

    def _reconnect(self, names: list[str]) -> None:
        for name in names:
            self._drop_lost(name)
        try:
            self.control.reconnect_ceph()
        except ReqcryptError as error:
            log.warning("could not reconnect to Ceph (%s); retrying at the next tick", error.detail)
            return
        except Exception:
            log.exception("could not reconnect to Ceph; retrying at the next tick")
            return
        self.stats.reconnects += 1
        log.info("new Ceph connection: RBD volumes may be taken again")

    def _renew(self, started: float) -> None:
        held = {uuid: holding.lease.epoch for uuid, holding in self.control.held.items()}
        held.update({uuid: lease.epoch for uuid, lease in self.pending.items()})
        renewed = self.leases.renew(held)
        deadline = started + self.lease_seconds
        lost = self.control.renewed(held, renewed, deadline)
        self.pending = {uuid: renewed[uuid] for uuid in self.pending if uuid in renewed}
        for volume in lost:
            self.stats.leases_lost += 1
            log.warning("lost the lease on volume %s: fenced, dropping it", volume.name)
            # Fenced already; the drop waits for the control lock, so not in this thread.
            threading.Thread(
                target=self._drop_lost, args=(volume.name,), name="reqcrypt-drop", daemon=True
            ).start()

    def _drop_lost(self, name: str) -> None:
        with contextlib.suppress(ReqcryptError):  # already gone (removed meanwhile)
            self.control.drop(name, graceful=False)

    def _take(self, started: float, *, rbd: bool) -> None:
        """Adopt under the control lock, and only when it is free: a lifecycle call holding
        it for seconds delays a takeover by a tick, never the next renewal. Without
        ``rbd`` (fenced), volumes on RBD devices are left to the other nodes."""
        with self.control.lock_unless_busy() as locked:
            if locked:
                self._take_locked(started + self.lease_seconds, rbd=rbd)

    def _take_locked(self, deadline: float, *, rbd: bool) -> None:
        now = time.monotonic()
        self.released = {uuid: until for uuid, until in self.released.items() if until > now}
        for uuid, name, lowers, handed in self._claimable_bottom_up():
            if not lowers <= self.control.volumes.keys():
                continue  # its lower volume is pending here: not before it is served
            if uuid in self.released and not handed:  # a move to this node is taken at once
                continue
            if not rbd and uuid not in self.pending and self.control.maps_rbd(uuid):
                continue
            lease = self.pending.get(uuid)
            if lease is None:
                lease = self.leases.take(uuid)
                if lease is None:
                    continue  # another node was quicker
                self.stats.takeovers += 1
            try:
                self.control.adopt(lease, deadline, take_over=True)
            except DeviceClaimed:
                self.stats.claims_blocked += 1
                if uuid not in self.pending:
                    log.warning("volume %s: lease taken, its device still claimed; retrying", name)
                self.pending[uuid] = lease
                continue
            except ReqcryptError as error:
                log.warning("volume %s: cannot adopt (%s); lease released", name, error.detail)
                self.pending.pop(uuid, None)
                self.leases.release(uuid, lease.epoch)
                continue
            self.pending.pop(uuid, None)
            log.info("volume %s: serving (epoch %d)", name, lease.epoch)

    def _claimable_bottom_up(self) -> list[tuple[str, str, set[str], bool]]:
        """The leases to take now (uuid, name, the volumes its tables map, handed to us),
        each after the volumes it maps, leaving out a stacked volume whose lower volume
        this node neither serves nor takes first."""
        handed: dict[str, bool] = {}
        claimable = {}
        for uuid, name, mine in self.leases.claimable():
            if uuid not in self.control.held and uuid not in self.leaving:
                claimable[uuid] = name
                handed[uuid] = mine
        if not claimable:
            return []
        texts = self.leases.tables_of(list(claimable))
        tables: dict[str, list[Table]] = {name: [] for name in self.control.volumes}
        uuids = {}
        for uuid, name in claimable.items():
            tables[name] = [parse_table(text) for text in texts[uuid]]
            uuids[name] = uuid
        order, stranded = stacking_order(tables)
        if stranded:
            log.debug("waiting for the lower volumes of %s", ", ".join(stranded))
        return [
            (
                uuids[name],
                name,
                set().union(*(table.volume_names() for table in tables[name])),
                handed[uuids[name]],
            )
            for name in order
            if name in uuids
        ]

    # ------------------------------------------------------------------ placement

    def live_nodes(self) -> list[NodeLoad]:
        return self.leases.live_nodes()

    def place(self) -> NodeLoad | None:
        """The live and ready node owning the fewest volumes (ties: by name); None: none."""
        nodes = self.live_nodes()
        return min(nodes, key=lambda node: (node.volumes, node.node), default=None)

    def move(self, name: str, target: str) -> bool:
        """Hand a volume this node serves to ``target`` with its whole stack: drain, flush
        and release each volume top-down, give the leases over bottom-up. Returns False
        when ``target`` is this node (nothing to do)."""
        if target == self.node:
            self.control.volume(name)
            return False
        if target not in {node.node for node in self.live_nodes()}:
            raise InvalidInput(f"node {target} is not a live node of the cluster")
        self.control.volume(name)
        stack = self.control.stacking.stack_of(name)
        uuids = {self.control.volume(member).uuid for member in stack}
        self.leaving.update(uuids)  # still ours in SQL until handed over: do not take back
        try:
            leases = {member: self.control.drop(member, graceful=True) for member in stack[::-1]}
            for member in stack:  # lower volumes first: the target adopts them bottom-up
                lease = leases[member]
                if lease is None or not self.leases.hand_over(lease.uuid, lease.epoch, target):
                    log.warning("volume %s: lease expired during the move; it fails over", member)
        finally:
            self.leaving.difference_update(uuids)
        return True

    def heartbeat_age(self) -> float | None:
        return None if self.last_heartbeat is None else time.monotonic() - self.last_heartbeat
