"""The devices this process has open: one record per device, beside the stores that hold
their bytes (``DeviceRegistry``).

A record is added only after its row is committed and removed only after its row is
deleted (ADR 0003); the caller holds the control lock for every change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from app.db.records import StoredDevice
from app.dm.targets import BlockDevice
from app.dm.timed import TimedDevice
from app.engine.registry import EngineRegistry
from app.errors import DeviceNotFound, InsufficientStorage, QuotaExceeded
from app.storage.registry import DeviceRegistry, Placement
from app.vocab import SECTOR_SIZE


@dataclass(frozen=True, slots=True)
class CatalogedDevice:
    name: str
    size_bytes: int
    model: str | None
    """The device model whose modelled time its I/O accrues (None: not modelled)."""
    placement: Placement

    @classmethod
    def of(cls, stored: StoredDevice) -> CatalogedDevice:
        return cls(
            stored.name,
            stored.size_bytes,
            stored.model,
            Placement(stored.store, stored.pool, stored.image),
        )


class DeviceCatalog:
    def __init__(self, stores: DeviceRegistry, engines: EngineRegistry) -> None:
        self.stores = stores
        self.engines = engines
        self._devices: dict[str, CatalogedDevice] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._devices

    def names(self) -> list[str]:
        return sorted(self._devices)

    def get(self, name: str) -> CatalogedDevice:
        try:
            return self._devices[name]
        except KeyError:
            raise DeviceNotFound(f"device {name} not found") from None

    def model_of(self, name: str) -> str | None:
        device = self._devices.get(name)
        return None if device is None else device.model

    def add(self, device: CatalogedDevice) -> None:
        """A device whose store was just created (its row committed)."""
        self._devices[device.name] = device

    def open(self, stored: StoredDevice) -> None:
        """A recorded device: open its store and list it."""
        device = CatalogedDevice.of(stored)
        self.stores.open(device.name, device.size_bytes, device.placement)
        self._devices[device.name] = device

    def remove(self, name: str) -> None:
        """Delete the store (its row is gone) and the record."""
        self.stores.remove(name)
        del self._devices[name]

    def sync(self, recorded: Iterable[StoredDevice], in_use: Callable[[str], bool]) -> None:
        """Open the devices recorded since (by other nodes); forget the ones no longer
        recorded that nothing here maps."""
        by_name = {device.name: device for device in recorded}
        for name, stored in by_name.items():
            if name not in self._devices:
                self.open(stored)
        for name in list(self._devices):
            if name not in by_name and not in_use(name):
                self.stores.forget(name)
                del self._devices[name]

    def check_quota(self, size_bytes: int, *, max_devices: int, max_total_bytes: int) -> None:
        if len(self._devices) >= max_devices:
            raise QuotaExceeded(
                f"the service holds at most {max_devices} devices "
                "(REQCRYPT_MAX_DEVICES); delete one first"
            )
        total = sum(device.size_bytes for device in self._devices.values()) + size_bytes
        if total > max_total_bytes:
            raise InsufficientStorage(
                f"devices would total {total} bytes; at most "
                f"{max_total_bytes} (REQCRYPT_MAX_TOTAL_DEVICE_BYTES)"
            )

    def size_sectors(self, name: str) -> int:
        return self.get(name).size_bytes // SECTOR_SIZE

    def resolve(self, name: str) -> BlockDevice:
        """The store a table line maps; a modelled device accrues virtual time."""
        store = self.stores.get(name)
        model = self.model_of(name)
        if model is None:
            return store
        return TimedDevice(store, self.engines.device_timer(model))

    def on_rbd(self, names: Iterable[str]) -> set[str]:
        """Those of ``names`` whose bytes are RBD images."""
        return {
            name
            for name in names
            if name in self._devices and self._devices[name].placement.store == "rbd"
        }

    def ceph_blocklisted(self) -> bool:
        """The Ceph client is blocklisted and not yet replaced: RBD images are unusable."""
        ceph = self.stores.ceph
        return ceph is not None and ceph.blocklisted

    def reconnect_ceph(self) -> None:
        """Open every RBD device again on a new Ceph connection."""
        self.stores.reconnect_ceph(
            {
                device.name: (device.size_bytes, device.placement)
                for device in self._devices.values()
                if device.placement.store == "rbd"
            }
        )

    def info(self, name: str) -> dict[str, Any]:
        device = self.get(name)
        return {
            "name": name,
            "size_bytes": device.size_bytes,
            "allocated_bytes": self.stores.get(name).allocated_bytes(),
            "model": device.model,
            "store": device.placement.store,
            "pool": device.placement.pool,
            "image": device.placement.image,
        }
