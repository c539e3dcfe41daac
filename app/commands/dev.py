"""``reqcrypt dev``: backing devices (sparse files in the service's data directory, or RBD
images)."""

from __future__ import annotations

from typing import Annotated

import typer

from app.commands.client import Service, listing, with_service
from app.commands.sizes import format_size, size

dev_app = typer.Typer(help="Backing devices: create, list, remove.", no_args_is_help=True)


@dev_app.command()
@with_service()
def create(
    service: Service,
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="device name, used in tables (e.g. sda2)")
    ],
    size_bytes: Annotated[
        int,
        typer.Argument(
            metavar="SIZE",
            parser=size,
            help="size, e.g. 64M, 1.5G, 4KiB or bytes (a multiple of 512)",
        ),
    ],
    model: Annotated[
        str | None, typer.Option(help="device timing model (GET /v1/device-models)")
    ] = None,
    store: Annotated[
        str,
        typer.Option(
            help="file (a sparse file) or rbd (an RBD image; the service needs REQCRYPT_CEPH_CONF)"
        ),
    ] = "file",
    pool: Annotated[
        str | None, typer.Option(help="Ceph pool of an rbd device (default rbd)")
    ] = None,
) -> None:
    """Create a backing device (a sparse file, or with --store rbd an RBD image)."""
    body: dict[str, object] = {"name": name, "size_bytes": size_bytes}
    if model is not None:
        body["model"] = model
    if store != "file":
        body["store"] = store
    if pool is not None:
        body["pool"] = pool
    service.request("POST", "/v1/devices", json=body)


@dev_app.command("ls")
@with_service()
def list_devices(service: Service) -> None:
    """List devices: size, space allocated, timing model and the volumes mapping each."""
    devices = listing(service, "/v1/devices")
    if not devices:
        return
    typer.echo(f"{'NAME':<16} {'SIZE':>8} {'ALLOC':>8} {'MODEL':<14} MAPPED BY")
    for device in devices:
        typer.echo(
            f"{device['name']:<16} {format_size(device['size_bytes']):>8} "
            f"{format_size(device['allocated_bytes']):>8} {device['model'] or '-':<14} "
            f"{','.join(device['mapped_by']) or '-'}"
        )


@dev_app.command("rm")
@with_service()
def remove(
    service: Service,
    name: Annotated[str, typer.Argument(metavar="NAME", help="device name")],
) -> None:
    """Remove a device and its file or RBD image (refused while a volume maps it)."""
    service.request("DELETE", f"/v1/devices/{name}")
