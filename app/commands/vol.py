"""``reqcrypt vol``: a volume's tuning (engine, dispatch mode, elevator, plug window, dm-crypt's
split sizes, NBD export).

``set`` takes ``key=value`` words, sysctl style, and sends them as one PATCH, so
either every setting changes or none does; ``show`` prints the current ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from app.commands.client import Service, VolumeName, with_service
from app.errors import InvalidInput
from app.sizes import parse_size

vol_app = typer.Typer(
    help="A volume's tuning: engine, dispatch mode, NBD export.", no_args_is_help=True
)

_SWITCH = {"on": True, "true": True, "yes": True, "1": True}
_SWITCH |= {"off": False, "false": False, "no": False, "0": False}


def _switch(text: str) -> bool:
    try:
        return _SWITCH[text.lower()]
    except KeyError:
        raise ValueError("expected on or off") from None


def _split_size(text: str) -> int:
    try:
        return parse_size(text)
    except InvalidInput as error:
        raise ValueError(str(error)) from None


def _microseconds(text: str) -> int:
    value = int(text.removesuffix("us"))
    if value < 0:
        raise ValueError("expected microseconds, 0 or more")
    return value


# key on the command line: (field of PATCH /v1/volumes/NAME, how to read the value)
SETTINGS: dict[str, tuple[str, Callable[[str], object]]] = {
    "engine": ("engine", str),
    "dispatch_mode": ("dispatch_mode", str),
    "elevator": ("elevator", str),
    "plug_window_us": ("plug_window_us", _microseconds),
    "max_read_size": ("crypt_split.max_read_size", _split_size),
    "max_write_size": ("crypt_split.max_write_size", _split_size),
    "nbd_export": ("nbd_export", _switch),
}
SHOWN = (
    "engine",
    "dispatch_mode",
    "elevator",
    "plug_window_us",
    "crypt_split.max_read_size",
    "crypt_split.max_write_size",
    "nbd_export",
)


def parse_settings(words: list[str]) -> dict[str, Any]:
    """``key=value`` words as a PATCH body; an unknown key or a bad value is a usage error."""
    body: dict[str, Any] = {}
    for word in words:
        key, equals, text = word.partition("=")
        if not equals or key not in SETTINGS:
            raise typer.BadParameter(
                f"{word}: expected KEY=VALUE with KEY one of {', '.join(SETTINGS)}"
            )
        field, read = SETTINGS[key]
        try:
            value = read(text)
        except ValueError as error:
            raise typer.BadParameter(f"{word}: {error}") from None
        group, dot, name = field.rpartition(".")
        if dot:  # a nested field: crypt_split.max_read_size
            body.setdefault(group, {})[name] = value
        else:
            body[field] = value
    return body


@vol_app.command("set")
@with_service()
def set_tuning(
    service: Service,
    name: VolumeName,
    settings: Annotated[
        list[str],
        typer.Argument(
            metavar="KEY=VALUE...",
            help="engine=NAME, dispatch_mode=bio|request, elevator=none|mq-deadline, "
            "plug_window_us=MICROSECONDS, max_read_size=SIZE, max_write_size=SIZE "
            "(dm-crypt's split, e.g. 128k), nbd_export=on|off",
        ),
    ],
) -> None:
    """Change volume NAME's settings, all at once or none; prints them afterwards."""
    body = parse_settings(settings)
    volume = service.request("PATCH", f"/v1/volumes/{name}", json=body).json()
    _print(volume)


@vol_app.command("show")
@with_service()
def show(
    service: Service,
    name: VolumeName,
) -> None:
    """Print volume NAME's settings as KEY=VALUE lines, the words set takes."""
    volume = service.request("GET", f"/v1/volumes/{name}").json()
    _print(volume)


def _print(volume: dict[str, Any]) -> None:
    for key in SHOWN:
        group, dot, name = key.rpartition(".")
        value = volume[group][name] if dot else volume[key]
        if isinstance(value, bool):
            shown: object = "on" if value else "off"
        else:
            shown = "none" if value is None else value
        typer.echo(f"{name}={shown}")
