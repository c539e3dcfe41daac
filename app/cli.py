"""The ``reqcrypt`` command: serve, migrate, bench, and clients (dmsetup, dev, io, iostat, engines)."""

from __future__ import annotations

import gc
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from typer import _click as click
from typer._click.exceptions import NoArgsIsHelpError, UsageError
from typer.core import TyperArgument, TyperGroup, TyperOption

from app.bench.cli import bench_app
from app.commands.dev import dev_app
from app.commands.engines import engines
from app.commands.io import io_app
from app.commands.iostat import iostat
from app.commands.luks import luks_app
from app.commands.trace import trace
from app.commands.vol import vol_app
from app.config import Settings
from app.dmsetup import dmsetup_app
from app.startup import fit_open_files, load_settings, refusals


class PlaceholderOption(TyperOption):
    """A switch shows no value; any other option an upper-case placeholder (``--bs SIZE``)."""

    def display_type_rich(self, ctx: click.Context) -> str | None:
        if self.is_flag or self.count:
            return None
        return self.metavar or (self.name or "value").upper()


class PlaceholderArgument(TyperArgument):
    """An argument is its placeholder alone (``SIZE``), never a Python type beside it."""

    def display_type_rich(self, ctx: click.Context) -> str | None:
        return None

    def _usage_display_name(self) -> str:
        """``NAME`` when required, ``[NAME]`` when not, as man pages write it (typer: ``{NAME}``)."""
        name = self.display_name_raw
        if self.nargs != 1 and self.metavar is None:
            name += "..."
        if self.required or name.startswith("["):
            return name
        return f"[{name}]"


def use_placeholders(command: click.Command) -> None:
    """Typer prints each parameter's Python type (``<bool>``, ``<int>``); we print placeholders."""
    help_option = command.get_help_option(click.Context(command))
    for param in [*command.params, *([help_option] if help_option else [])]:
        if type(param) is TyperOption:
            param.__class__ = PlaceholderOption
        elif type(param) is TyperArgument:
            param.__class__ = PlaceholderArgument
    if isinstance(command, TyperGroup):
        for sub in command.commands.values():
            use_placeholders(sub)


class Reqcrypt(TyperGroup):
    """The root command: placeholders in help, and every error as ``reqcrypt: <what>: <why>``.

    Usage errors (exit 2) follow the same one-line format as a service's problem
    (``reqcrypt: POST /v1/devices: 422 …``, app/commands/client.py).
    """

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        use_placeholders(self)
        try:
            result = super().main(
                args=args,
                prog_name=prog_name or "reqcrypt",
                complete_var=complete_var,
                standalone_mode=False,
                **extra,
            )
        except NoArgsIsHelpError as error:
            typer.echo(error.ctx.get_help(), nl=False)
            code = 0
        except click.ClickException as error:
            where = "reqcrypt"
            if isinstance(error, UsageError) and error.ctx is not None:
                where = error.ctx.command_path
            command = where.partition(" ")[2]
            hint = f" (see reqcrypt {command} --help)" if command else " (see reqcrypt --help)"
            what = f"{command}: " if command else ""
            typer.echo(f"reqcrypt: {what}{error.format_message()}{hint}", err=True)
            code = error.exit_code
        except typer.Abort:
            typer.echo("reqcrypt: aborted", err=True)
            code = 1
        else:
            code = result if isinstance(result, int) else 0
        if standalone_mode:
            sys.exit(code)
        return code


cli = typer.Typer(
    cls=Reqcrypt, help="reqcrypt: encrypted block volumes over HTTP.", no_args_is_help=True
)


def _print_version(asked: bool) -> None:
    if asked:
        from importlib.metadata import version

        typer.echo(f"reqcrypt {version('reqcrypt')}")
        raise typer.Exit()


@cli.callback()
def root(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="print the version and exit"
        ),
    ] = False,
) -> None:
    """reqcrypt: encrypted block volumes over HTTP."""


GC_YOUNG_THRESHOLD = 20_000
"""Allocations less deallocations of container objects that start a young-generation
collection in ``serve`` (CPython's default is 700)."""


def settle_collector() -> None:
    """The cyclic collector as ``serve`` runs it once the service is built (and enabled).

    What is built so far lives as long as the process: frozen, it is out of the collector's
    sight, and a full collection no longer walks it (≈ 80 ms on the event loop here) to find
    nothing. A batch of small I/O allocates more than the default 700 objects that start a
    young-generation collection (NBD at queue depth 32: one collection per batch, walking
    every I/O in flight); the young generation is let grow further.
    """
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    gc.enable()


def startup_lines(settings: Settings, admin_token_file: Path) -> list[str]:
    """Every listener (HTTP, NBD and whether it has TLS), where the tokens and the key are."""
    shown = "localhost" if settings.host in ("127.0.0.1", "::1") else settings.host
    base = f"http://{shown}:{settings.port}"
    lines = [f"HTTP on {base} (docs at {base}/docs)"]
    if settings.nbd_port is not None:
        if settings.nbd_tls_cert is None:
            security = "no TLS"
        elif settings.nbd_tls_ca is None:
            security = "TLS"
        else:
            security = "TLS, client certificates required"
        lines.append(f"NBD on {shown}:{settings.nbd_port} ({security}), exported volumes only")
    if settings.auth == "disabled":
        lines.append("authentication disabled (loopback only)")
    elif settings.admin_token is None:
        lines.append(
            f"authenticate with 'Authorization: Bearer TOKEN'; "
            f"the admin token is in {admin_token_file}"
        )
    else:
        lines.append("authenticate with the admin token in REQCRYPT_ADMIN_TOKEN")
    if settings.auth != "disabled" and settings.io_token is not None:
        lines.append("the io token (data path, read-only status) is in REQCRYPT_IO_TOKEN")
    if settings.master_key is None:
        lines.append(f"the master key is in {settings.resolved_master_key_file}")
    return lines


@cli.command()
def serve(
    host: Annotated[str | None, typer.Option(help="bind address (REQCRYPT_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="port (REQCRYPT_PORT)")] = None,
    workers: Annotated[
        int, typer.Option(help="always 1: for more cores run one serve per core as cluster nodes")
    ] = 1,
) -> None:
    """Migrate the database (unless REQCRYPT_MIGRATE_ON_START=false) and serve the API."""
    # Start-up builds ~250k objects that live as long as the process and little cyclic
    # garbage (~5k objects, ~1.7 MB, frozen below with the rest): collections while it
    # imports and migrates walked them again and again, a third of start-up's CPU time.
    gc.disable()
    try:
        import uvicorn

        from app.io.memory import tune_malloc
        from app.keyfiles import admin_token_path, data_dir_lock
        from app.main import check_master_key, create_app, http_protocol

        if workers != 1:
            raise typer.BadParameter(
                "one process serves a volume (its queue is in memory): for more cores run one "
                "`reqcrypt serve` per core, each with its own REQCRYPT_NODE_ID and REQCRYPT_PORT"
            )
        overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
        settings = load_settings(**overrides)
        for line in startup_lines(settings, admin_token_path(settings)):
            typer.echo(f"reqcrypt: {line}")
        tune_malloc()
        with refusals("serve"), data_dir_lock(settings, exclusive=False):
            fit_open_files(settings)
            check_master_key(settings)
            application = create_app(settings)
            settle_collector()
            uvicorn.run(
                application,
                host=settings.host,
                port=settings.port,
                log_level=settings.log_level,
                # Below info the access log drops every line, after building its arguments.
                access_log=settings.log_level.lower() in ("trace", "debug", "info"),
                proxy_headers=False,
                timeout_keep_alive=settings.keep_alive_seconds,
                http=http_protocol(settings),
            )
    finally:
        gc.enable()


@cli.command("rotate-master-key")
def rotate_master_key() -> None:
    """Re-wrap every stored key under a new master key (with the service stopped).

    Crash-safe: an interrupted rotation is finished or undone at the next start.
    """
    from app.keyfiles import data_dir_lock
    from app.main import rotate_master_key as rotate

    settings = load_settings()
    with refusals("rotate-master-key"), data_dir_lock(settings, exclusive=True):
        count = rotate(settings)
    typer.echo(
        f"reqcrypt: re-wrapped {count} keys under a new master key in "
        f"{settings.resolved_master_key_file}"
    )


@cli.command()
def migrate(
    revision: Annotated[
        str, typer.Argument(metavar="REVISION", help="Alembic revision to upgrade to")
    ] = "head",
) -> None:
    """Upgrade the database to REVISION (default: head)."""
    from app.db import migrate as migrations
    from app.db.checks import check_server
    from app.keyfiles import make_data_dir

    settings = load_settings()
    with refusals("migrate"):
        make_data_dir(settings)
        check_server(settings.resolved_database_url)
    migrations.upgrade(settings.resolved_database_url, revision)
    typer.echo(f"reqcrypt: database at {revision}")


cli.add_typer(dev_app, name="dev")
cli.add_typer(dmsetup_app, name="dmsetup")
cli.add_typer(io_app, name="io")
cli.add_typer(vol_app, name="vol")
cli.add_typer(luks_app, name="luks")
cli.command()(iostat)
cli.command()(trace)
cli.command()(engines)
cli.add_typer(bench_app, name="bench")


def main() -> None:
    cli()
