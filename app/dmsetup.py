"""``reqcrypt dmsetup``: the dmsetup verbs against a running service, over its HTTP API.

Same words and output shapes as dmsetup(8) where they exist (``create``, ``load``,
``table``, ``status``, ``info``, ``ls``, ``suspend``, ``resume``, ``message``,
``rename``, ``remove``, ``clear``), so a device-mapper user needs no manual: like
dmsetup, ``table``, ``status`` and ``info`` without a NAME report every volume, and
``create`` and ``load`` read the table from standard input when none is given. The
URL and token follow app/commands/client.py (flags, REQCRYPT_URL/REQCRYPT_TOKEN, the
admin token file of a local service).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from app.commands.client import Service, VolumeName, listing, with_service

dmsetup_app = typer.Typer(
    help="dmsetup verbs against a running reqcrypt service.", no_args_is_help=True
)

OptionalName = Annotated[
    str | None, typer.Argument(metavar="NAME", help="volume name (default: every volume)")
]
TableOption = Annotated[
    str | None, typer.Option("--table", metavar="TABLE", help="table text, one target per line")
]
TableFileOption = Annotated[
    Path | None,
    typer.Option("--table-file", metavar="FILE", help="file holding the table; - for stdin"),
]


def _table_text(table: str | None, table_file: Path | None) -> str:
    """--table, else --table-file, else standard input (dmsetup's habit)."""
    if table is not None:
        return table
    if table_file is not None and str(table_file) != "-":
        return table_file.read_text()
    return sys.stdin.read()


def _names(service: Service, name: str | None) -> list[str]:
    if name is not None:
        return [name]
    return [volume["name"] for volume in service.request("GET", "/v1/volumes").json()]


def _per_volume(name: str | None, lines: dict[str, str]) -> str:
    """One volume's text as it is; several prefixed ``name: `` per line, as dmsetup does."""
    if name is not None:
        return lines[name]
    if not lines:
        return "No devices found\n"
    return "".join(
        f"{volume}: {line}\n" for volume, text in lines.items() for line in text.splitlines()
    )


@dmsetup_app.command()
@with_service()
def create(
    service: Service,
    name: VolumeName,
    table: TableOption = None,
    table_file: TableFileOption = None,
) -> None:
    """Create and activate volume NAME from a table (--table, --table-file, else stdin)."""
    body = {"name": name, "table": _table_text(table, table_file)}
    service.request("POST", "/v1/volumes", json=body)


@dmsetup_app.command()
@with_service()
def load(
    service: Service,
    name: VolumeName,
    table: TableOption = None,
    table_file: TableFileOption = None,
) -> None:
    """Load a table into NAME's inactive slot (resume swaps it in); reads stdin by default."""
    service.request(
        "PUT",
        f"/v1/volumes/{name}/table",
        content=_table_text(table, table_file),
        headers={"Content-Type": "text/plain"},
    )


@dmsetup_app.command()
@with_service()
def table(
    service: Service,
    name: OptionalName = None,
    showkeys: Annotated[
        bool, typer.Option("--showkeys", help="print the keys instead of zeros (admin only)")
    ] = False,
    inactive: Annotated[
        bool, typer.Option("--inactive", help="print the inactive table loaded by load")
    ] = False,
) -> None:
    """Print the table exactly as dmsetup table does; keys are zeros unless --showkeys."""
    params = {"show_keys": str(showkeys).lower(), "inactive": str(inactive).lower()}
    tables = {
        volume: service.request("GET", f"/v1/volumes/{volume}/table", params=params).text
        for volume in _names(service, name)
    }
    typer.echo(_per_volume(name, tables), nl=False)


def _status_text(body: dict[str, Any]) -> str:
    stats = body["stats"]
    keys = ("r_ios", "w_ios", "r_merges", "w_merges", "rareq_sz", "wareq_sz", "aqu_sz")
    counters = "  ".join(f"{key}={stats[key]:.4g}" for key in (*keys, "engine_calls"))
    return f"{body['status']}{counters}\n"


@dmsetup_app.command()
@with_service()
def status(service: Service, name: OptionalName = None) -> None:
    """Print dmsetup status lines, then the queue statistics (every volume without NAME)."""
    reports = {
        volume: _status_text(service.request("GET", f"/v1/volumes/{volume}/status").json())
        for volume in _names(service, name)
    }
    typer.echo(_per_volume(name, reports), nl=False)


def _info_text(body: dict[str, Any]) -> str:
    state = "ACTIVE" if body["state"] == "active" else "SUSPENDED"
    tables = " & ".join(body["tables"]) or "None"
    return (
        f"Name:              {body['name']}\n"
        f"State:             {state}\n"
        f"Tables present:    {tables}\n"
        f"Open count:        {body['open_count']}\n"
        f"Event number:      {body['event_nr']}\n"
        f"Number of targets: {len(body['targets'])}\n"
        f"UUID:              {body['uuid']}\n"
        f"Dispatch mode:     {body['dispatch_mode']}\n"
        f"Engine:            {body['engine']}\n"
    )


@dmsetup_app.command()
@with_service()
def info(service: Service, name: OptionalName = None) -> None:
    """Print NAME's state the way dmsetup info does; without NAME, every volume's."""
    if name is not None:
        bodies = [service.request("GET", f"/v1/volumes/{name}").json()]
    else:
        bodies = listing(service, "/v1/volumes")
    typer.echo("\n".join(_info_text(body) for body in bodies), nl=False)


@dmsetup_app.command("ls")
@with_service()
def list_volumes(service: Service) -> None:
    """List volumes: name, size in sectors and state."""
    for volume in listing(service, "/v1/volumes"):
        typer.echo(f"{volume['name']}\t({volume['size_sectors']} sectors, {volume['state']})")


@dmsetup_app.command()
@with_service()
def suspend(
    service: Service,
    name: VolumeName,
    noflush: Annotated[
        bool,
        typer.Option("--noflush", help="do not wait for in-flight I/O; hold it with the rest"),
    ] = False,
) -> None:
    """Suspend NAME: drain in-flight I/O (unless --noflush), then hold new I/O until resume."""
    service.request("POST", f"/v1/volumes/{name}/suspend", json={"noflush": noflush})


@dmsetup_app.command()
@with_service()
def resume(service: Service, name: VolumeName) -> None:
    """Resume NAME, swapping in the inactive table if there is one."""
    service.request("POST", f"/v1/volumes/{name}/resume")


@dmsetup_app.command()
@with_service()
def message(
    service: Service,
    name: VolumeName,
    sector: Annotated[int, typer.Argument(metavar="SECTOR", help="sector of the target")],
    words: Annotated[list[str], typer.Argument(metavar="MESSAGE...", help="the message words")],
) -> None:
    """Send a target message to NAME, e.g. message vol 0 key wipe."""
    body = {"message": " ".join(words), "sector": sector}
    service.request("POST", f"/v1/volumes/{name}/message", json=body)


@dmsetup_app.command()
@with_service()
def rename(
    service: Service,
    name: VolumeName,
    new_name: Annotated[str, typer.Argument(metavar="NEW_NAME", help="the volume's new name")],
) -> None:
    """Rename volume NAME to NEW_NAME."""
    service.request("POST", f"/v1/volumes/{name}/rename", json={"new_name": new_name})


@dmsetup_app.command()
@with_service()
def clear(service: Service, name: VolumeName) -> None:
    """Drop NAME's inactive table."""
    service.request("DELETE", f"/v1/volumes/{name}/table")


@dmsetup_app.command()
@with_service()
def remove(
    service: Service,
    name: VolumeName,
    force: Annotated[
        bool,
        typer.Option("--force", help="replace the table with error first, failing held I/O"),
    ] = False,
) -> None:
    """Remove volume NAME."""
    service.request("DELETE", f"/v1/volumes/{name}", params={"force": str(force).lower()})
