"""Backing devices: sparse files in the data directory, or RBD images in a Ceph pool."""

from __future__ import annotations

from fastapi import APIRouter, Response

from app.api.deps import AdminDep, ControlDep, RoleDep
from app.api.problems import responses
from app.api.schemas import DeviceCreate, DeviceOut
from app.errors import DeviceNotFound

router = APIRouter(prefix="/v1/devices", tags=["devices"], responses=responses(401, 403))


@router.post(
    "", status_code=201, response_model=DeviceOut, responses=responses(404, 409, 422, 503, 507)
)
def create_device(body: DeviceCreate, control: ControlDep, _: AdminDep) -> DeviceOut:
    control.create_device(body.name, body.size_bytes, body.model, store=body.store, pool=body.pool)
    return DeviceOut(**control.device_info(body.name))


@router.get("", response_model=list[DeviceOut])
def list_devices(control: ControlDep, _: RoleDep) -> list[DeviceOut]:
    """The devices present now: one deleted while the list is built (a benchmark's
    temporary device) is left out rather than failing the list."""
    devices = []
    for name in control.device_names():
        try:
            devices.append(DeviceOut(**control.device_info(name)))
        except DeviceNotFound:
            continue
    return devices


@router.get("/{name}", response_model=DeviceOut, responses=responses(404))
def get_device(name: str, control: ControlDep, _: RoleDep) -> DeviceOut:
    return DeviceOut(**control.device_info(name))


@router.delete("/{name}", status_code=204, responses=responses(404, 409))
def delete_device(name: str, control: ControlDep, _: AdminDep) -> Response:
    control.delete_device(name)
    return Response(status_code=204)
