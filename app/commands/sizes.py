"""Sizes and offsets on the command line: ``64M``, ``1G``, ``4k``, ``512KiB`` or bytes."""

from __future__ import annotations

import typer

from app.errors import InvalidInput
from app.sizes import format_size, parse_size

__all__ = ["format_size", "size"]


def size(text: str) -> int:
    """A typer parser: fio's size grammar (powers of two), refused with the reason."""
    try:
        return parse_size(text)
    except InvalidInput as error:
        raise typer.BadParameter(error.detail) from None
