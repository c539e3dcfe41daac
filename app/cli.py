"""The ``reqcrypt`` command: serve, migrate, bench, and clients (dmsetup, dev, io, iostat, engines)."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from typing import Annotated

import typer
from pydantic import ValidationError

from app.bench.cli import bench_app
from app.commands.dev import dev_app
from app.commands.engines import engines
from app.commands.io import io_app
from app.commands.iostat import iostat
from app.config import Settings, describe
from app.dmsetup import dmsetup_app

cli = typer.Typer(help="reqcrypt: encrypted block volumes over HTTP.", no_args_is_help=True)


def tune_malloc() -> None:
    """Keep MiB-sized I/O buffers on the heap instead of fresh page-faulted mmaps.

    glibc maps every allocation above 128 KiB anew and unmaps it on free; each
    1 MiB body then costs ~0.9 ms of page faults (DESIGN.md performance notes).
    """
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return
    libc = ctypes.CDLL(libc_name)
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 64 << 20)
    libc.mallopt(m_trim_threshold, 256 << 20)


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment; a bad one is a line on stderr and exit 2, no traceback."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as error:
        for line in describe(error):
            typer.echo(f"reqcrypt: {line}", err=True)
        raise typer.Exit(2) from None


@cli.command()
def serve(
    host: Annotated[str | None, typer.Option(help="bind address (REQCRYPT_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="port (REQCRYPT_PORT)")] = None,
    workers: Annotated[
        int, typer.Option(help="always 1: for more cores run one serve per core as cluster nodes")
    ] = 1,
) -> None:
    """Migrate the database (unless REQCRYPT_MIGRATE_ON_START=false) and serve the API."""
    import uvicorn

    from app.db.checks import DatabaseRefused
    from app.keyfiles import MasterKeyError, ServiceRunning, admin_token_path, data_dir_lock
    from app.main import check_master_key, create_app, http_protocol

    if workers != 1:
        raise typer.BadParameter(
            "one process serves a volume (its queue is in memory): for more cores run one "
            "`reqcrypt serve` per core, each with its own REQCRYPT_NODE_ID and REQCRYPT_PORT"
        )
    overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    settings = load_settings(**overrides)
    shown = "localhost" if settings.host in ("127.0.0.1", "::1") else settings.host
    typer.echo(f"reqcrypt: docs at http://{shown}:{settings.port}/docs")
    if settings.auth == "disabled":
        typer.echo("reqcrypt: authentication disabled (loopback only)")
    elif settings.admin_token is None:
        typer.echo(
            f"reqcrypt: authenticate with 'Authorization: Bearer <token>'; "
            f"the admin token is in {admin_token_path(settings)}"
        )
    else:
        typer.echo("reqcrypt: authenticate with the token in REQCRYPT_ADMIN_TOKEN")
    if settings.master_key is None:
        typer.echo(f"reqcrypt: the master key is in {settings.resolved_master_key_file}")
    tune_malloc()
    try:
        with data_dir_lock(settings, exclusive=False):
            check_master_key(settings)
            application = create_app(settings)
            # What is built so far lives as long as the process: frozen, it is out of the
            # cyclic collector's sight, and a full collection no longer walks its ~134k
            # objects (≈ 80 ms on the event loop here) to find nothing.
            gc.freeze()
            uvicorn.run(
                application,
                host=settings.host,
                port=settings.port,
                log_level=settings.log_level,
                proxy_headers=False,
                timeout_keep_alive=settings.keep_alive_seconds,
                http=http_protocol(settings),
            )
    except (DatabaseRefused, MasterKeyError, ServiceRunning) as error:
        typer.echo(f"reqcrypt: {error}", err=True)
        raise typer.Exit(1) from None


@cli.command("rotate-master-key")
def rotate_master_key() -> None:
    """Re-wrap every stored key under a new master key (with the service stopped).

    Crash-safe: an interrupted rotation is finished or undone at the next start.
    """
    from app.db.checks import DatabaseRefused
    from app.keyfiles import MasterKeyError, ServiceRunning, data_dir_lock
    from app.main import rotate_master_key as rotate

    settings = load_settings()
    try:
        with data_dir_lock(settings, exclusive=True):
            count = rotate(settings)
    except (DatabaseRefused, MasterKeyError, ServiceRunning) as error:
        typer.echo(f"reqcrypt: {error}", err=True)
        raise typer.Exit(1) from None
    typer.echo(
        f"reqcrypt: re-wrapped {count} keys under a new master key in "
        f"{settings.resolved_master_key_file}"
    )


@cli.command()
def migrate(
    revision: Annotated[str, typer.Argument(help="target revision")] = "head",
) -> None:
    """Upgrade the database to REVISION (default: head)."""
    from app.db import migrate as migrations
    from app.db.checks import DatabaseRefused, check_server

    settings = load_settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    try:
        check_server(settings.resolved_database_url)
    except DatabaseRefused as error:
        typer.echo(f"reqcrypt: {error}", err=True)
        raise typer.Exit(1) from None
    migrations.upgrade(settings.resolved_database_url, revision)
    typer.echo(f"reqcrypt: database at {revision}")


cli.add_typer(dev_app, name="dev")
cli.add_typer(dmsetup_app, name="dmsetup")
cli.add_typer(io_app, name="io")
cli.command()(iostat)
cli.command()(engines)
cli.add_typer(bench_app, name="bench")


def main() -> None:
    cli()
