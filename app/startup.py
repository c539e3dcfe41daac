"""What an in-process command does before its work: settings from the environment, and a
refusal to start as the one error line every command prints (``reqcrypt: <what>: <why>``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer
from pydantic import ValidationError

from app.commands.client import fail
from app.config import Settings, describe


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
    except (DatabaseRefused, MasterKeyError, ServiceRunning) as error:
        fail(f"{command}: {error}")
    except OSError as error:
        where = f"{error.filename}: " if error.filename is not None else ""
        fail(f"{command}: {where}{error.strerror or error}")
