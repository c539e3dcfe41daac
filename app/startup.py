"""What an in-process command does before its work: settings from the environment, and a
refusal to start as the one error line every command prints (``reqcrypt: <what>: <why>``)."""

from __future__ import annotations

import resource
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from pydantic import ValidationError

from app.commands.client import fail
from app.config import Settings, describe

OPEN_FILES_RESERVE = 128
"""Open files beyond the connection caps: the database, devices, logs, the listeners."""


class OpenFilesRefused(Exception):
    """The connection caps do not fit the process's hard open-file limit."""


def fit_open_files(settings: Settings) -> None:
    """Raise the soft open-file limit to what the connection caps need (up to the hard
    limit), or refuse: past the limit a new connection is not refused cleanly at a cap,
    ``accept`` fails and every listener stalls until a descriptor frees."""
    needed = settings.max_connections + OPEN_FILES_RESERVE
    if settings.nbd_port is not None:
        needed += settings.nbd_max_connections
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise OpenFilesRefused(
            f"the connection caps need {needed} open files (REQCRYPT_MAX_CONNECTIONS "
            f"{settings.max_connections}, REQCRYPT_NBD_MAX_CONNECTIONS when NBD is on, "
            f"{OPEN_FILES_RESERVE} more), the hard limit is {hard}: lower the caps or raise "
            "`ulimit -Hn`"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment; a bad one is a line on stderr and exit 2, no traceback."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as error:
        for line in describe(error):
            typer.echo(f"reqcrypt: {line}", err=True)
        raise typer.Exit(2) from None


@contextmanager
def refusals(command: str) -> Iterator[None]:
    """A refusal to run (the database, the master key, a running service, the system) as
    the one error line every command prints: ``reqcrypt: <command>: <why>``, exit 1."""
    from app.db.checks import DatabaseRefused
    from app.keyfiles import MasterKeyError, ServiceRunning

    try:
        yield
    except (DatabaseRefused, MasterKeyError, ServiceRunning, OpenFilesRefused) as error:
        fail(f"{command}: {error}")
    except OSError as error:
        where = f"{error.filename}: " if error.filename is not None else ""
        fail(f"{command}: {where}{error.strerror or error}")
