"""Open backing stores by device name: sparse files in one directory of the data dir, or
RBD images (``<prefix><device name>``) in a Ceph pool."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from app.errors import AlreadyExists, DeviceNotFound, InvalidInput
from app.storage.base import BackingStore, close_all
from app.storage.file import FileStore
from app.storage.rbd import CephCluster, RbdStore
from app.vocab import StoreKind


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a device's bytes live: a file, or an RBD image in a pool."""

    store: StoreKind = "file"
    pool: str | None = None
    image: str | None = None


class DeviceRegistry:
    def __init__(
        self,
        root: Path,
        ceph: CephCluster | None = None,
        *,
        rbd_prefix: str = "reqcrypt-",
        rbd_aio: bool = True,
    ) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.ceph = ceph
        self.rbd_prefix = rbd_prefix
        self.rbd_aio = rbd_aio
        self._stores: dict[str, BackingStore] = {}
        self._lock = threading.Lock()

    def path(self, name: str) -> Path:
        return self.root / f"{name}.img"

    def placement(self, name: str, store: StoreKind, pool: str | None) -> Placement:
        """Check a new device's store and pool; an RBD device's image is named after it."""
        if store == "file":
            if pool is not None:
                raise InvalidInput("pool applies only to store rbd")
            return Placement()
        if self.ceph is None:
            raise InvalidInput("store rbd is not available: REQCRYPT_CEPH_CONF is not set")
        return Placement("rbd", pool or "rbd", self.rbd_prefix + name)

    def create(
        self, name: str, size_bytes: int, placement: Placement = Placement()
    ) -> BackingStore:
        with self._lock:
            if name in self._stores:
                raise AlreadyExists(f"device {name} exists")
            store: BackingStore
            if placement.store == "rbd":
                store = self._rbd(placement, size_bytes, create=True)
            else:
                path = self.path(name)
                if path.exists():
                    path.unlink()  # an orphan of an earlier failed create; no row refers to it
                store = FileStore(path, size_bytes, create=True)
            self._stores[name] = store
            return store

    def open(self, name: str, size_bytes: int, placement: Placement = Placement()) -> BackingStore:
        with self._lock:
            store: BackingStore
            if placement.store == "rbd":
                store = self._rbd(placement, size_bytes, create=False)
            else:
                store = FileStore(self.path(name), size_bytes)
            self._stores[name] = store
            return store

    def _rbd(self, placement: Placement, size_bytes: int, *, create: bool) -> RbdStore:
        if self.ceph is None:
            raise InvalidInput("store rbd is not available: REQCRYPT_CEPH_CONF is not set")
        assert placement.pool is not None
        assert placement.image is not None
        return RbdStore(
            self.ceph.ioctx(placement.pool),
            placement.image,
            size_bytes,
            create=create,
            cluster=self.ceph,
            aio=self.rbd_aio,
        )

    def get(self, name: str) -> BackingStore:
        try:
            return self._stores[name]
        except KeyError:
            raise DeviceNotFound(f"device {name} not found") from None

    def names(self) -> list[str]:
        return sorted(self._stores)

    def check_removable(self, name: str) -> None:
        """Refuse (``DeviceBusy``) to delete an RBD image another client has open."""
        store = self._stores.get(name)
        if isinstance(store, RbdStore):
            store.check_unwatched()

    def remove(self, name: str) -> None:
        """Close the device and delete its file or image. An RBD image is deleted only
        when this registry created or opened it: a name clash never deletes another's."""
        with self._lock:
            store = self._stores.pop(name, None)
            if isinstance(store, RbdStore):
                store.remove()
                return
            if store is not None:
                store.close()
            self.path(name).unlink(missing_ok=True)

    def reconnect_ceph(self, placements: Mapping[str, tuple[int, Placement]]) -> None:
        """Open the RBD devices ``placements`` names (name: size, placement) again on a new
        librados connection, the old one being blocklisted (``CephCluster.reconnect``).
        Nothing may use them meanwhile: the caller dropped every volume mapping one."""
        if self.ceph is None:
            return
        with self._lock:
            rbd_names = [name for name in placements if name in self._stores]

            def close_images() -> None:
                for name in rbd_names:
                    self._stores.pop(name).close()

            self.ceph.reconnect(close_images)
            for name in rbd_names:
                size_bytes, placement = placements[name]
                self._stores[name] = self._rbd(placement, size_bytes, create=False)

    def forget(self, name: str) -> None:
        """Close a device another node deleted (it already removed the file)."""
        with self._lock:
            store = self._stores.pop(name, None)
            if store is not None:
                store.close()

    def close(self) -> None:
        with self._lock:
            close_all(self._stores)
            if self.ceph is not None:
                self.ceph.close()
