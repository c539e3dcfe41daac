"""``reqcrypt dmsetup``: the dmsetup verbs against a running service, over its HTTP API.

Same words and output shapes as dmsetup(8) where they exist (``create``, ``load``,
``table``, ``status``, ``info``, ``ls``, ``suspend``, ``resume``, ``message``,
``rename``, ``remove``, ``clear``), so a device-mapper user needs no manual. The
URL and token follow app/commands/client.py (flags, REQCRYPT_URL/REQCRYPT_TOKEN, the
admin token file of a local service).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from app.commands.client import (
    DEFAULT_URL,
    TokenOption,
    UrlOption,
    fail,
    problem_detail,
    resolve_token,
)

dmsetup_app = typer.Typer(help="dmsetup verbs against a running reqcrypt service.")


def _call(url: str, token: str | None, method: str, path: str, **kwargs: Any) -> httpx.Response:
    resolved = resolve_token(token)
    headers = {"Authorization": f"Bearer {resolved}"} if resolved else {}
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
            response = client.request(method, path, **kwargs)
    except httpx.HTTPError as error:
        fail(f"cannot reach {url}: {error}")
    if response.is_error:
        typer.echo(
            f"device-mapper: {method.lower()} {path} failed: {problem_detail(response)}", err=True
        )
        raise typer.Exit(1)
    return response


def _table_text(table: str | None, table_file: Path | None) -> str:
    if table is not None:
        return table
    if table_file is not None:
        return sys.stdin.read() if str(table_file) == "-" else table_file.read_text()
    raise typer.BadParameter("give --table TEXT or --table-file FILE (- for stdin)")


TableOption = Annotated[str | None, typer.Option("--table", help="table text")]
TableFileOption = Annotated[
    Path | None, typer.Option("--table-file", help="file with the table, - for stdin")
]


@dmsetup_app.command()
def create(
    name: str,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    table: TableOption = None,
    table_file: TableFileOption = None,
) -> None:
    """Create and activate a volume from a table."""
    body = {"name": name, "table": _table_text(table, table_file)}
    _call(url, token, "POST", "/v1/volumes", json=body)


@dmsetup_app.command()
def load(
    name: str,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    table: TableOption = None,
    table_file: TableFileOption = None,
) -> None:
    """Load a table into the inactive slot (resume swaps it in)."""
    _call(
        url,
        token,
        "PUT",
        f"/v1/volumes/{name}/table",
        content=_table_text(table, table_file),
        headers={"Content-Type": "text/plain"},
    )


@dmsetup_app.command()
def table(
    name: str,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    showkeys: Annotated[bool, typer.Option("--showkeys")] = False,
    inactive: Annotated[bool, typer.Option("--inactive")] = False,
) -> None:
    """Print the table exactly as dmsetup table does."""
    params = {"show_keys": str(showkeys).lower(), "inactive": str(inactive).lower()}
    typer.echo(_call(url, token, "GET", f"/v1/volumes/{name}/table", params=params).text, nl=False)


@dmsetup_app.command()
def status(name: str, url: UrlOption = DEFAULT_URL, token: TokenOption = None) -> None:
    """Print dmsetup status lines, then the queue statistics."""
    body = _call(url, token, "GET", f"/v1/volumes/{name}/status").json()
    typer.echo(body["status"], nl=False)
    stats = body["stats"]
    keys = ("r_ios", "w_ios", "r_merges", "w_merges", "rareq_sz", "wareq_sz", "aqu_sz")
    typer.echo("  ".join(f"{key}={stats[key]:.4g}" for key in (*keys, "engine_calls")))


@dmsetup_app.command()
def info(name: str, url: UrlOption = DEFAULT_URL, token: TokenOption = None) -> None:
    """Print the volume's state the way dmsetup info does."""
    body = _call(url, token, "GET", f"/v1/volumes/{name}").json()
    state = "ACTIVE" if body["state"] == "active" else "SUSPENDED"
    tables = " & ".join(body["tables"]) or "None"
    typer.echo(
        f"Name:              {body['name']}\n"
        f"State:             {state}\n"
        f"Tables present:    {tables}\n"
        f"Open count:        {body['open_count']}\n"
        f"Event number:      {body['event_nr']}\n"
        f"Number of targets: {len(body['targets'])}\n"
        f"UUID:              {body['uuid']}\n"
        f"Dispatch mode:     {body['dispatch_mode']}\n"
        f"Engine:            {body['engine']}"
    )


@dmsetup_app.command("ls")
def list_volumes(url: UrlOption = DEFAULT_URL, token: TokenOption = None) -> None:
    """List volumes."""
    volumes = _call(url, token, "GET", "/v1/volumes").json()
    if not volumes:
        typer.echo("No devices found")
    for volume in volumes:
        typer.echo(f"{volume['name']}\t({volume['size_sectors']} sectors, {volume['state']})")


@dmsetup_app.command()
def suspend(
    name: str,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    noflush: Annotated[bool, typer.Option("--noflush")] = False,
) -> None:
    """Suspend: drain in-flight I/O (unless --noflush), then hold new I/O."""
    _call(url, token, "POST", f"/v1/volumes/{name}/suspend", json={"noflush": noflush})


@dmsetup_app.command()
def resume(name: str, url: UrlOption = DEFAULT_URL, token: TokenOption = None) -> None:
    """Resume, swapping in the inactive table if there is one."""
    _call(url, token, "POST", f"/v1/volumes/{name}/resume")


@dmsetup_app.command()
def message(
    name: str,
    sector: int,
    words: list[str],
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Send a target message, e.g. ``message vol 0 key wipe``."""
    body = {"message": " ".join(words), "sector": sector}
    _call(url, token, "POST", f"/v1/volumes/{name}/message", json=body)


@dmsetup_app.command()
def rename(
    name: str, new_name: str, url: UrlOption = DEFAULT_URL, token: TokenOption = None
) -> None:
    """Rename a volume."""
    _call(url, token, "POST", f"/v1/volumes/{name}/rename", json={"new_name": new_name})


@dmsetup_app.command()
def clear(name: str, url: UrlOption = DEFAULT_URL, token: TokenOption = None) -> None:
    """Drop the inactive table."""
    _call(url, token, "DELETE", f"/v1/volumes/{name}/table")


@dmsetup_app.command()
def remove(
    name: str,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    force: Annotated[bool, typer.Option("--force")] = False,
) -> None:
    """Remove a volume (--force: replace its table with error first)."""
    _call(url, token, "DELETE", f"/v1/volumes/{name}", params={"force": str(force).lower()})
