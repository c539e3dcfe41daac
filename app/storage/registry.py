"""Open backing stores by device name; the files live in one directory of the data dir."""

from __future__ import annotations

import threading
from pathlib import Path

from app.errors import AlreadyExists, DeviceNotFound
from app.storage.base import BackingStore
from app.storage.file import FileStore


class DeviceRegistry:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self._stores: dict[str, BackingStore] = {}
        self._lock = threading.Lock()

    def path(self, name: str) -> Path:
        return self.root / f"{name}.img"

    def create(self, name: str, size_bytes: int) -> BackingStore:
        with self._lock:
            if name in self._stores:
                raise AlreadyExists(f"device {name} exists")
            path = self.path(name)
            if path.exists():
                path.unlink()  # an orphan of an earlier failed create; no row refers to it
            store = FileStore(path, size_bytes, create=True)
            self._stores[name] = store
            return store

    def open(self, name: str, size_bytes: int) -> BackingStore:
        with self._lock:
            store = FileStore(self.path(name), size_bytes)
            self._stores[name] = store
            return store

    def get(self, name: str) -> BackingStore:
        try:
            return self._stores[name]
        except KeyError:
            raise DeviceNotFound(f"device {name} not found") from None

    def names(self) -> list[str]:
        return sorted(self._stores)

    def remove(self, name: str) -> None:
        with self._lock:
            store = self._stores.pop(name, None)
            if store is not None:
                store.close()
            self.path(name).unlink(missing_ok=True)

    def forget(self, name: str) -> None:
        """Close a device another node deleted (it already removed the file)."""
        with self._lock:
            store = self._stores.pop(name, None)
            if store is not None:
                store.close()

    def close(self) -> None:
        with self._lock:
            for store in self._stores.values():
                store.close()
            self._stores.clear()
