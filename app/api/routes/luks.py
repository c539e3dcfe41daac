"""LUKS on a device: luksFormat, luksDump, luksAddKey, luksKillSlot; and luksOpen's table.

Each key derivation runs on a worker thread under one ``CapacityLimiter``
(``REQCRYPT_LUKS_PBKDF_WORKERS``): a request waiting its turn holds no thread, so a
flood of unlocks queues here without taking threads, memory or the event loop from
the data path. Header writes are serialized by one lock. A wrong passphrase is
403 after the same work whichever slot it missed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import anyio
from fastapi import APIRouter, Request, Response

from app.api.deps import AdminDep, RoleDep, StateDep
from app.api.luks_schemas import (
    LuksDumpOut,
    LuksFormatIn,
    LuksKeyslotAddedOut,
    LuksKeyslotIn,
    LuksKillIn,
    LuksOpenIn,
)
from app.api.problems import responses
from app.luks.device import add_key, dump, forget, format_device, kill_slot, open_table
from app.luks.header import Disk, read_header
from app.luks.kdf import KdfCeiling
from app.state import State

router = APIRouter(
    prefix="/v1/devices/{name}/luks", tags=["luks"], responses=responses(401, 403, 404)
)

T = TypeVar("T")
_header_writes = threading.Lock()


def ceiling(state: State) -> KdfCeiling:
    settings = state.settings.luks
    return KdfCeiling(
        memory_kib=settings.luks_max_pbkdf_memory_kib,
        time=settings.luks_max_pbkdf_time,
        parallel=settings.luks_max_pbkdf_parallel,
        iterations=settings.luks_max_pbkdf_iterations,
        unlock_work=settings.luks_max_unlock_work,
    )


async def run_kdf(request: Request, state: State, work: Callable[[], T]) -> T:
    """``work`` on a thread once one of the PBKDF places is free."""
    limiter = getattr(request.app.state, "luks_limiter", None)
    if limiter is None:
        limiter = anyio.CapacityLimiter(state.settings.luks.luks_pbkdf_workers)
        request.app.state.luks_limiter = limiter
    return await anyio.to_thread.run_sync(work, limiter=limiter)


def dump_out(disk: Disk, state: State) -> LuksDumpOut:
    return LuksDumpOut(**dump(read_header(disk, ceiling(state)), disk.size))


@router.post("", status_code=201, response_model=LuksDumpOut, responses=responses(409, 422))
async def luks_format(
    name: str, body: LuksFormatIn, request: Request, state: StateDep, _: AdminDep
) -> LuksDumpOut:
    """luksFormat: a new volume key and keyslot 0; refused (409) while a volume maps the
    device, here or on another cluster node."""
    control = state.control

    def work() -> LuksDumpOut:
        control.check_header_change(name, unmapped=True)
        secret = body.secret()
        try:
            with control.holding(name) as disk, _header_writes:
                header, key = format_device(disk, secret, body.options(), ceiling(state))
                key.wipe()
                return LuksDumpOut(**dump(header, disk.size))
        finally:
            forget(secret)

    return await run_kdf(request, state, work)


@router.get("", response_model=LuksDumpOut, responses=responses(422))
async def luks_dump(name: str, state: StateDep, _: RoleDep) -> LuksDumpOut:
    """luksDump; 404 when the device holds no LUKS header. Read-only and free of secrets,
    so the I/O token may read it like any other status."""

    def work() -> LuksDumpOut:
        with state.control.holding(name) as disk:
            return dump_out(disk, state)

    return await anyio.to_thread.run_sync(work)


@router.post(
    "/keyslots",
    status_code=201,
    response_model=LuksKeyslotAddedOut,
    responses=responses(409, 422),
)
async def luks_add_key(
    name: str, body: LuksKeyslotIn, request: Request, state: StateDep, _: AdminDep
) -> LuksKeyslotAddedOut:
    """luksAddKey: the lowest free keyslot also opens with ``new_passphrase``; refused (409)
    while a volume another cluster node serves maps the device."""

    def work() -> LuksKeyslotAddedOut:
        state.control.check_header_change(name, unmapped=False)
        secret = body.secret()
        new = body.new_secret()
        try:
            with state.control.holding(name) as disk, _header_writes:
                header, slot = add_key(disk, secret, new, body.pbkdf.options(), ceiling(state))
                return LuksKeyslotAddedOut(slot=slot, dump=LuksDumpOut(**dump(header, disk.size)))
        finally:
            forget(secret)
            forget(new)

    return await run_kdf(request, state, work)


@router.delete("/keyslots/{slot}", status_code=204, responses=responses(409, 422))
async def luks_kill_slot(
    name: str, slot: int, body: LuksKillIn, request: Request, state: StateDep, _: AdminDep
) -> Response:
    """luksKillSlot: a passphrase of another keyslot; the last one only with ``force``;
    refused (409) while a volume another cluster node serves maps the device."""

    def work() -> None:
        state.control.check_header_change(name, unmapped=False)
        secret = body.optional_secret()
        try:
            with state.control.holding(name) as disk, _header_writes:
                kill_slot(disk, slot, secret, ceiling(state), force=body.force)
        finally:
            forget(secret)

    await run_kdf(request, state, work)
    return Response(status_code=204)


async def open_luks(spec: LuksOpenIn, request: Request, state: State) -> str:
    """luksOpen: the crypt table ``cryptsetup open`` maps for this device and passphrase."""

    def work() -> str:
        secret = spec.secret()
        try:
            with state.control.holding(spec.device) as disk:
                return open_table(
                    disk, secret, ceiling(state), spec.device, allow_discards=spec.allow_discards
                )
        finally:
            forget(secret)

    return await run_kdf(request, state, work)
