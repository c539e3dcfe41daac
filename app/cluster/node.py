"""The lease loop of one cluster node: several ``reqcrypt serve`` sharing PostgreSQL and
the devices.

Each volume is served by exactly one node, the holder of its lease
(``app.db.leases``). A background thread ticks every ``renew_interval``
(a quarter of the lease by default) and, in this order:

1. heartbeats (the ``nodes`` row other nodes place volumes and redirect by);
2. renews every lease it holds in one statement; a volume whose lease was not
   renewed is dropped at once without writing (``ServingSet.renewed``), and every
   I/O on a volume is refused past the local deadline of its last renewal even
   if this thread is late (``DataPath.lease_deadline``) — a node frozen past its
   lease therefore never writes again for it. A watchdog thread of its own drops a
   volume whose deadline passed unrenewed (``ServingSet.expired``), so a tick stuck on
   an unanswering database still lets the devices go for the node taking over;
3. takes every lease that is free, expired, or handed to it (``move``), claims
   the volume's devices with ``take_over`` and adopts the volume. A claim the
   store refuses (a file-backed device still locked by a stopped, not dead,
   previous owner) keeps the lease *pending*: renewed, retried every tick, the
   volume unserved (503) until the old owner notices and lets go.

A whole stack lives on one node (``app.cluster.placement``): a scan takes free
leases bottom-up, adopting an upper volume right after its lower, and never takes an
upper whose lower this node does not serve (it waits for the node that takes the
lower); a move hands over the whole stack; a clean stop drops top-down.

A node whose Ceph client was blocklisted (another node broke one of its image
locks; it learns so at the first I/O the OSDs refuse, or at ``/readyz``) can write
to no image through that connection. Its next tick gives up every volume
mapping an RBD device: its I/O stops and its lease is released at once (the other nodes
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

from app.cluster.placement import Claimable, least_loaded, takeover_order
from app.cluster.serving import ServingSet
from app.config import ClusterSettings
from app.control import Control
from app.db.leases import Lease, NodeLoad
from app.dm.table import parse_table
from app.dm.volume import Volume
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
    def __init__(self, control: Control, serving: ServingSet, settings: ClusterSettings) -> None:
        self.control = control
        self.serving = serving
        self.leases = serving.leases
        self.node = serving.node
        self.settings = settings
        self.stats = ClusterStats()
        self.last_heartbeat: float | None = None
        self.announced_ready = False
        """What the last heartbeat told placement (``nodes.ready``)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None
        self._tick_lock = threading.Lock()
        self._reconnecting: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """One tick before serving (adopt what is ours or free), then the thread."""
        self.tick()
        self._thread = threading.Thread(target=self._run, name="reqcrypt-leases", daemon=True)
        self._thread.start()
        self._watchdog = threading.Thread(
            target=self._fence_expired, name="reqcrypt-fence", daemon=True
        )
        self._watchdog.start()

    def stop(self) -> None:
        """A clean stop: drop every volume durably and release its lease at once, so
        another node takes it in one tick instead of a lease."""
        self._stop.set()
        for thread in (self._thread, self._watchdog):
            if thread is not None:
                thread.join(timeout=self.settings.lease_seconds + 5)
        try:  # place nothing more here while this node still looks alive
            self.leases.heartbeat(self.settings.advertised_url, ready=False)
        except Exception:
            log.exception("could not mark this node as stopping")
        with self._tick_lock:
            for name in reversed(self.control.bottom_up()):
                try:
                    lease = self.drop(name, graceful=True)
                    if lease is not None:
                        self.leases.release(lease.uuid, lease.epoch)
                except Exception:
                    log.exception("could not hand volume %s back cleanly", name)
            for lease in self.serving.pending.values():
                self.leases.release(lease.uuid, lease.epoch)
            self.serving.pending.clear()

    def _run(self) -> None:
        while not self._stop.wait(self.settings.renew_interval):
            try:
                self.tick()
            except Exception:
                self.stats.tick_failures += 1
                log.exception("lease tick failed")

    def _fence_expired(self) -> None:
        """Drop every volume past its local deadline, in a thread of its own: a tick stuck
        on an unanswering database must not keep a fenced volume's devices claimed (a
        file's flock would block the node taking the lease over)."""
        while not self._stop.wait(self.settings.renew_interval / 2):
            for volume in self.serving.expired(time.monotonic()):
                self.stats.leases_lost += 1
                log.warning("volume %s: lease deadline passed unrenewed; dropping it", volume.name)
                threading.Thread(
                    target=self._drop_lost, args=(volume.name,), name="reqcrypt-drop", daemon=True
                ).start()

    def drop(self, name: str, *, graceful: bool) -> Lease | None:
        """Stop serving a volume (``Control.stop_serving``); returns the lease it held
        (None: already lost)."""
        holding = self.serving.holding(self.control.volume(name).uuid)
        self.control.stop_serving(name, graceful=graceful)
        return None if holding is None else holding.lease

    # ------------------------------------------------------------------ tick

    @property
    def blocklisted(self) -> bool:
        """The Ceph client is blocklisted and not yet replaced: RBD devices are unusable."""
        return self.control.catalog.ceph_blocklisted()

    def tick(self) -> None:
        with self._tick_lock:
            started = time.monotonic()
            blocklisted = self.blocklisted
            self.leases.heartbeat(self.settings.advertised_url, ready=not blocklisted)
            self.last_heartbeat = started
            self.announced_ready = not blocklisted
            if blocklisted:
                self._give_up_rbd()
            self._renew(started)
            self._take(started, rbd=not blocklisted)

    def _give_up_rbd(self) -> None:
        """Release the leases of every volume on an RBD device now, and reconnect (in a
        thread: the drops wait for the control lock) unless that is under way."""
        if self._reconnecting is not None and self._reconnecting.is_alive():
            return
        catalog = self.control.catalog
        given_up = self.control.reaching(catalog.on_rbd(catalog.names()))
        for volume in given_up:
            lease = self.serving.let_go(volume)
            if lease is not None:
                self.leases.release(lease.uuid, lease.epoch)
                self.serving.released[lease.uuid] = time.monotonic() + self.settings.lease_seconds
                self.stats.rbd_fenced += 1
                log.warning("volume %s: Ceph client blocklisted; lease released", volume.name)
        self._reconnecting = threading.Thread(
            target=self._reconnect,
            args=(given_up,),
            name="reqcrypt-reconnect",
            daemon=True,
        )
        self._reconnecting.start()

    def _reconnect(self, volumes: list[Volume]) -> None:
        for volume in volumes:
            self._drop_lost(volume.name)
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
        asked = self.serving.asked()
        renewed = self.leases.renew(asked)
        lost = self.serving.renewed(asked, renewed, started + self.settings.lease_seconds)
        for volume in lost:
            self.stats.leases_lost += 1
            log.warning("lost the lease on volume %s: I/O refused, dropping it", volume.name)
            # I/O refused already (deadline passed); the drop waits for the control lock, so
            # not in this thread.
            threading.Thread(
                target=self._drop_lost, args=(volume.name,), name="reqcrypt-drop", daemon=True
            ).start()

    def _drop_lost(self, name: str) -> None:
        with contextlib.suppress(ReqcryptError):  # already gone (removed meanwhile)
            self.control.stop_serving(name, graceful=False)

    def _take(self, started: float, *, rbd: bool) -> None:
        """Adopt under the control lock, and only when it is free: a lifecycle call holding
        it for seconds delays a takeover by a tick, never the next renewal. Without
        ``rbd`` (blocklisted), volumes on RBD devices are left to the other nodes."""
        with self.control.lock_unless_busy() as locked:
            if locked:
                self._take_locked(started + self.settings.lease_seconds, rbd=rbd)

    def _take_locked(self, deadline: float, *, rbd: bool) -> None:
        serving = self.serving
        now = time.monotonic()
        serving.released = {uuid: until for uuid, until in serving.released.items() if until > now}
        for claim in self._claimable_bottom_up():
            uuid, name = claim.uuid, claim.name
            if not all(self.control.serves(lower) for lower in claim.lowers):
                continue  # its lower volume is pending here: not before it is served
            if uuid in serving.released and not claim.handed:  # a move here is taken at once
                continue
            if (
                not rbd
                and uuid not in serving.pending
                and self.control.catalog.on_rbd(self.control.recorded_devices(uuid))
            ):
                continue
            lease = serving.pending.get(uuid)
            if lease is None:
                lease = self.leases.take(uuid)
                if lease is None:
                    continue  # another node was quicker
                self.stats.takeovers += 1
            try:
                volume = self.control.adopt(uuid, take_over=True)
            except DeviceClaimed:
                self.stats.claims_blocked += 1
                if uuid not in serving.pending:
                    log.warning("volume %s: lease taken, its device still claimed; retrying", name)
                serving.pending[uuid] = lease
                continue
            except ReqcryptError as error:
                log.warning("volume %s: cannot adopt (%s); lease released", name, error.detail)
                serving.pending.pop(uuid, None)
                self.leases.release(uuid, lease.epoch)
                continue
            serving.hold(volume, lease, deadline)
            serving.pending.pop(uuid, None)
            log.info("volume %s: serving (epoch %d)", name, lease.epoch)

    def _claimable_bottom_up(self) -> list[Claimable]:
        claimable = {
            uuid: (name, handed)
            for uuid, name, handed in self.leases.claimable()
            if not self.serving.serves(uuid) and uuid not in self.serving.leaving
        }
        if not claimable:
            return []
        texts = self.leases.tables_of(list(claimable))
        tables = {uuid: [parse_table(text) for text in texts[uuid]] for uuid in claimable}
        order, stranded = takeover_order(claimable, tables, self.control.served())
        if stranded:
            log.debug("waiting for the lower volumes of %s", ", ".join(stranded))
        return order

    # ------------------------------------------------------------------ placement

    def live_nodes(self) -> list[NodeLoad]:
        return self.leases.live_nodes()

    def place(self) -> NodeLoad | None:
        """The live and ready node owning the fewest volumes; None: none."""
        return least_loaded(self.live_nodes())

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
        stack = self.control.stack_of(name)
        uuids = {self.control.volume(member).uuid for member in stack}
        self.serving.leaving.update(uuids)  # still ours in SQL until handed over: not taken back
        try:
            leases = {member: self.drop(member, graceful=True) for member in stack[::-1]}
            for member in stack:  # lower volumes first: the target adopts them bottom-up
                lease = leases[member]
                if lease is None or not self.leases.hand_over(lease.uuid, lease.epoch, target):
                    log.warning("volume %s: lease expired during the move; it fails over", member)
        finally:
            self.serving.leaving.difference_update(uuids)
        return True

    def heartbeat_age(self) -> float | None:
        return None if self.last_heartbeat is None else time.monotonic() - self.last_heartbeat
