"""The device catalog: one record per device, kept in step with the recorded rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.control.catalog import CatalogedDevice, DeviceCatalog
from app.db.records import StoredDevice
from app.engine.registry import EngineRegistry
from app.errors import DeviceNotFound, InsufficientStorage, QuotaExceeded
from app.storage.registry import DeviceRegistry, Placement

SIZE = 1 << 20


@pytest.fixture
def catalog(tmp_path: Path) -> DeviceCatalog:
    stores = DeviceRegistry(tmp_path / "devices")
    for name in ("a", "b"):
        stores.create(name, SIZE)
    return DeviceCatalog(stores, EngineRegistry())


def test_a_sync_opens_what_others_recorded_and_forgets_what_they_deleted(
    catalog: DeviceCatalog,
) -> None:
    catalog.add(CatalogedDevice("a", SIZE, None, Placement()))
    catalog.sync([StoredDevice("b", SIZE, "sd-card")], in_use=lambda name: False)
    assert catalog.names() == ["b"]
    assert catalog.get("b") == CatalogedDevice("b", SIZE, "sd-card", Placement())
    with pytest.raises(DeviceNotFound):
        catalog.get("a")


def test_a_sync_keeps_a_deleted_device_a_volume_here_still_maps(catalog: DeviceCatalog) -> None:
    catalog.add(CatalogedDevice("a", SIZE, None, Placement()))
    catalog.sync([], in_use=lambda name: name == "a")
    assert catalog.names() == ["a"]


def test_the_device_count_is_capped(catalog: DeviceCatalog) -> None:
    catalog.add(CatalogedDevice("a", SIZE, None, Placement()))
    with pytest.raises(QuotaExceeded):
        catalog.check_quota(SIZE, max_devices=1, max_total_bytes=10 * SIZE)


def test_the_total_size_is_capped(catalog: DeviceCatalog) -> None:
    catalog.add(CatalogedDevice("a", SIZE, None, Placement()))
    with pytest.raises(InsufficientStorage, match=f"{3 * SIZE} bytes"):
        catalog.check_quota(2 * SIZE, max_devices=8, max_total_bytes=2 * SIZE)


def test_only_devices_on_rbd_images_are_named_on_rbd(catalog: DeviceCatalog) -> None:
    catalog.add(CatalogedDevice("a", SIZE, None, Placement()))
    catalog.add(CatalogedDevice("b", SIZE, None, Placement("rbd", "rbd", "reqcrypt-b")))
    assert catalog.on_rbd(["a", "b", "gone"]) == {"b"}
