"""Volumes: dmsetup create/load/suspend/resume/message/remove/rename, info, table and status."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from functools import partial
from typing import Any

import anyio
import httpx
from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from app.api.deps import AdminDep, ControlDep, RoleDep, StateDep, admin_only
from app.api.problems import responses
from app.api.routes import luks
from app.api.schemas import (
    CryptSplitOut,
    MessageIn,
    MoveIn,
    NbdConnectionOut,
    OwnerOut,
    QueueLimitsIn,
    RenameIn,
    SuspendIn,
    TableIn,
    TargetOut,
    VolumeCreate,
    VolumeOut,
    VolumePatch,
)
from app.cluster import ClusterNode
from app.cluster.relay import FORWARDED_BY
from app.db.leases import Owner
from app.dm.table import DeviceRef, format_table
from app.dm.volume import Volume, VolumeInfo
from app.errors import InvalidState, Unavailable
from app.nbd.server import NbdServer
from app.state import State
from app.vocab import SECTOR_SIZE, TABLE_PATTERN

router = APIRouter(prefix="/v1/volumes", tags=["volumes"], responses=responses(401, 403))


def owner_out(volume: Volume, cluster: ClusterNode | None) -> OwnerOut | None:
    holding = None if cluster is None else cluster.serving.holding(volume.uuid)
    if cluster is None or holding is None:
        return None
    return OwnerOut(
        node=cluster.node,
        url=cluster.settings.advertised_url,
        lease_epoch=holding.lease.epoch,
        lease_expires_at=holding.lease.expires_at,
        lease_remaining_seconds=round(max(0.0, holding.deadline - time.monotonic()), 3),
    )


def recorded_owner_out(owner: Owner | None) -> OwnerOut | None:
    """The owner as the database says (None: no node holds the lease)."""
    if owner is None or owner.node is None or owner.url is None or owner.expires_at is None:
        return None
    return OwnerOut(
        node=owner.node,
        url=owner.url,
        lease_epoch=owner.epoch,
        lease_expires_at=owner.expires_at,
        lease_remaining_seconds=round(owner.remaining_seconds, 3),
    )


def info_out(
    info: VolumeInfo,
    targets: list[TargetOut],
    *,
    open_count: int,
    nbd_export: bool,
    nbd_connections: list[NbdConnectionOut],
    owner: OwnerOut | None,
    suspend_wait_seconds: float,
) -> VolumeOut:
    tables: list[Any] = (["LIVE"] if info.has_live else []) + (
        ["INACTIVE"] if info.has_inactive else []
    )
    return VolumeOut(
        name=info.name,
        uuid=info.uuid,
        state=info.state,
        size_sectors=info.size_sectors,
        size_bytes=info.size_sectors * SECTOR_SIZE,
        open_count=open_count,
        event_nr=info.event_nr,
        tables=tables,
        targets=targets,
        dispatch_mode=info.dispatch_mode,
        engine=info.engine,
        elevator=info.elevator,
        queue_limits=QueueLimitsIn(**asdict(info.limits)),
        plug_window_us=info.plug_window_us,
        crypt_split=CryptSplitOut(
            max_read_size=info.crypt_split[0], max_write_size=info.crypt_split[1]
        ),
        queue_depth=info.queue_depth,
        logical_block_size=info.limits.logical_block_size,
        nbd_export=nbd_export,
        nbd_connections=nbd_connections,
        suspend_wait_seconds=suspend_wait_seconds,
        owner=owner,
    )


def volume_out(volume: Volume, state: State, nbd: NbdServer | None = None) -> VolumeOut:
    info = volume.info()
    targets = [
        TargetOut(
            start=line.start,
            length=line.length,
            target_type=line.target_type,
            params=line.target.format(show_keys=False),
        )
        for line in (volume.live.table.lines if volume.live else ())
    ]
    return info_out(
        info,
        targets,
        open_count=state.control.stacking.open_count(info.name),
        nbd_export=volume.nbd_export,
        nbd_connections=[
            NbdConnectionOut(**connection) for connection in nbd.connections_of(volume)
        ]
        if nbd is not None
        else [],
        owner=owner_out(volume, state.cluster),
        suspend_wait_seconds=state.http.suspend_wait_seconds,
    )


def cluster_volumes(state: State) -> list[VolumeOut]:
    """Every volume of the cluster: the ones this node serves as it serves them, the
    others as SQL records them with the owner the database names (no call to another
    node: a frozen one cannot stall the list). Their ``nbd_connections`` are the owner's
    to tell (empty here)."""
    assert state.cluster is not None
    control = state.control
    owners = state.cluster.leases.owners()
    recorded = control.recorded.all()
    listed = []
    for record in recorded:
        volume = control.volumes.get(record.info.name)
        if volume is not None and state.cluster.serving.serves(volume.uuid):
            listed.append(volume_out(volume, state, state.nbd))
            continue
        mapper = DeviceRef("volume", record.info.name, "").key
        listed.append(
            info_out(
                record.info,
                [
                    TargetOut(start=start, length=length, target_type=kind, params=params)
                    for start, length, kind, params in record.targets
                ],
                open_count=sum(mapper in keys for other in recorded for keys in other.maps),
                nbd_export=record.nbd_export,
                nbd_connections=[],
                owner=recorded_owner_out(owners.get(record.info.uuid)),
                suspend_wait_seconds=state.http.suspend_wait_seconds,
            )
        )
    return listed


async def table_text(request: Request) -> str:
    """A table body as ``text/plain`` (what dmsetup reads) or JSON ``{"table": ...}``."""
    raw = await request.body()
    content_type = request.headers.get("content-type", "text/plain").split(";")[0].strip()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPException(400, "table text must be UTF-8") from None
    if content_type == "application/json":
        try:
            body = json.loads(text)
        except ValueError:
            raise HTTPException(400, "malformed JSON body") from None
        try:
            return TableIn.model_validate(body).table
        except ValidationError as exc:
            raise RequestValidationError(
                [{**error, "loc": ("body", *error["loc"])} for error in exc.errors()]
            ) from None
    if content_type != "text/plain":
        raise HTTPException(415, "send the table as text/plain or application/json")
    return text


@router.post("", status_code=201, response_model=VolumeOut, responses=responses(404, 409, 422))
async def create_volume(
    body: VolumeCreate, request: Request, state: StateDep, _: AdminDep
) -> VolumeOut:
    """dmsetup create, or luksOpen (``luks``: a wrong passphrase is 403)."""
    table = body.table if body.luks is None else await luks.open_luks(body.luks, request, state)
    assert table is not None
    volume = await anyio.to_thread.run_sync(
        partial(
            state.control.create_volume,
            body.name,
            table,
            engine=body.engine,
            tuning=body.tuning(),
            nbd_export=body.nbd_export,
        )
    )
    return volume_out(volume, state)


@router.get("", response_model=list[VolumeOut])
def list_volumes(state: StateDep, _: RoleDep) -> list[VolumeOut]:
    """The volumes present now: one removed while the list is built is left out. On a
    cluster node, every volume of the cluster, each with its owner."""
    if state.cluster is not None:
        return cluster_volumes(state)
    control = state.control
    listed = []
    for name in sorted(control.volumes):
        volume = control.volumes.get(name)
        if volume is not None:
            listed.append(volume_out(volume, state))
    return listed


@router.get("/{name}", response_model=VolumeOut, responses=responses(404))
def get_volume(name: str, state: StateDep, _: RoleDep) -> VolumeOut:
    return volume_out(state.control.volume(name), state, state.nbd)


@router.patch("/{name}", response_model=VolumeOut, responses=responses(404, 422))
def patch_volume(name: str, body: VolumePatch, state: StateDep, _: AdminDep) -> VolumeOut:
    state.control.retune(name, engine=body.engine, patch=body.patch())
    if body.nbd_export is not None:
        state.control.set_nbd_export(name, body.nbd_export)
    return volume_out(state.control.volume(name), state)


@router.delete("/{name}", status_code=204, responses=responses(404, 409))
def remove_volume(name: str, control: ControlDep, _: AdminDep, force: bool = False) -> Response:
    control.remove(name, force=force)
    return Response(status_code=204)


@router.get(
    "/{name}/table",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {}}}, **responses(403, 404)},
)
def get_table(
    name: str, control: ControlDep, role: RoleDep, show_keys: bool = False, inactive: bool = False
) -> PlainTextResponse:
    """Exactly ``dmsetup table`` (``--inactive`` with ?inactive=true); keys zeroed unless asked."""
    if show_keys and role != "admin":
        raise admin_only("show_keys")
    volume = control.volume(name)
    table = volume.inactive if inactive else (volume.live.table if volume.live else None)
    text = format_table(table, show_keys=show_keys) if table is not None else ""
    return PlainTextResponse(text, headers={"Cache-Control": "no-store"})


@router.put(
    "/{name}/table",
    status_code=204,
    responses=responses(404, 409, 415, 422),
    openapi_extra={
        "requestBody": {
            "content": {
                "text/plain": {
                    "schema": {"type": "string", "minLength": 1, "pattern": TABLE_PATTERN}
                },
                "application/json": {"schema": {"$ref": "#/components/schemas/TableIn"}},
            },
            "required": True,
        }
    },
)
async def load_table(name: str, request: Request, control: ControlDep, _: AdminDep) -> Response:
    """dmsetup load: the table goes to the inactive slot; resume swaps it in."""
    text = await table_text(request)
    await anyio.to_thread.run_sync(control.load_table, name, text)
    return Response(status_code=204)


@router.delete("/{name}/table", status_code=204, responses=responses(404))
def clear_table(name: str, control: ControlDep, _: AdminDep) -> Response:
    """dmsetup clear: drop the inactive table."""
    control.clear_inactive(name)
    return Response(status_code=204)


@router.post("/{name}/suspend", response_model=VolumeOut, responses=responses(404, 503))
def suspend_volume(
    name: str, state: StateDep, _: AdminDep, body: SuspendIn | None = None
) -> VolumeOut:
    state.control.suspend(name, noflush=body.noflush if body else False)
    return volume_out(state.control.volume(name), state)


@router.post("/{name}/resume", response_model=VolumeOut, responses=responses(404, 409))
def resume_volume(name: str, state: StateDep, _: AdminDep) -> VolumeOut:
    state.control.resume(name)
    return volume_out(state.control.volume(name), state)


@router.post("/{name}/message", status_code=204, responses=responses(404, 409, 422))
def message_volume(name: str, body: MessageIn, control: ControlDep, _: AdminDep) -> Response:
    control.message(name, body.message, body.sector)
    return Response(status_code=204)


@router.post("/{name}/rename", response_model=VolumeOut, responses=responses(404, 409, 422))
def rename_volume(name: str, body: RenameIn, state: StateDep, _: AdminDep) -> VolumeOut:
    state.control.rename(name, body.new_name)
    return volume_out(state.control.volume(body.new_name), state)


@router.post("/{name}/move", response_model=VolumeOut, responses=responses(404, 409, 422, 503))
def move_volume(name: str, body: MoveIn, request: Request, state: StateDep, _: AdminDep) -> Any:
    """Hand the volume to another live node of the cluster: this node drains it, makes it
    durable, releases its devices and gives the lease over; the answer is the volume as
    its new owner serves it. A stacked volume moves with its whole stack (the volumes it
    maps and those mapping it: one node serves them all). Any node accepts the call (it
    runs on the owner)."""
    if state.cluster is None:
        raise InvalidState("move needs a cluster: this node runs without REQCRYPT_NODE_ID")
    target = next((n for n in state.cluster.live_nodes() if n.node == body.node), None)
    if not state.cluster.move(name, body.node) or target is None:
        return volume_out(state.control.volume(name), state, state.nbd)
    return wait_served(target.url, name, request.headers.get("authorization"), state.cluster)


def wait_served(base: str, name: str, authorization: str | None, cluster: ClusterNode) -> Any:
    """The volume's info from ``base`` once that node serves it (within a lease or two)."""
    headers = {FORWARDED_BY: cluster.node}
    if authorization is not None:
        headers["Authorization"] = authorization
    deadline = time.monotonic() + 2 * cluster.settings.lease_seconds + 5
    with httpx.Client(timeout=5) as http:
        while True:
            try:
                answer = http.get(f"{base}/v1/volumes/{name}", headers=headers)
                if answer.status_code == 200:
                    return answer.json()
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise Unavailable(
                    f"volume {name} was handed over but its new owner does not serve it yet",
                    retry_after=1,
                )
            time.sleep(0.1)


@router.get("/{name}/status", responses=responses(404))
def volume_status(name: str, state: StateDep, _: RoleDep) -> dict[str, Any]:
    """``dmsetup status`` lines plus iostat-style statistics of the volume's queue
    (HTTP and NBD I/O alike) and, when the NBD server runs, its requests and connections."""
    volume = state.control.volume(name)
    lines = []
    if volume.live is not None:
        for line, target in zip(volume.live.table.lines, volume.live.targets, strict=True):
            lines.append(f"{line.start} {line.length} {line.target_type} {target.status()}")
    return {
        "name": volume.name,
        "state": volume.state,
        "status": "\n".join(lines) + ("\n" if lines else ""),
        "dispatch_mode": volume.dispatch_mode,
        "engine": volume.engine.name,
        "in_flight": volume.in_flight,
        "stats": volume.stats.snapshot(),
        "nbd": {
            **state.nbd.stats_of(volume).snapshot(),
            "connections": state.nbd.connections_of(volume),
        }
        if state.nbd is not None
        else None,
    }


@router.post("/{name}/stats/reset", status_code=204, responses=responses(404))
def reset_stats(name: str, control: ControlDep, _: AdminDep) -> Response:
    control.volume(name).stats.reset()
    return Response(status_code=204)
