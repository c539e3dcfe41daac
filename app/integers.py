"""Integers as JSON Schema counts them: ``4096.0`` is the integer 4096, ``4096.5`` is not.

Request models are strict (no ``"4096"``, no ``true`` for a number), but strict
pydantic also refuses an integral float, which every JSON Schema validator, and
so every client generated from the OpenAPI document, may send for an integer.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator


def integral_float(value: Any) -> Any:
    """An integral float becomes its int; anything else goes on to the strict int check."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JsonInt = Annotated[int, BeforeValidator(integral_float)]
"""A strict int that also takes an integral float (never a bool, a string or 1.5).

Give its bounds as ``x: JsonInt = Field(ge=...)``. Inside another ``Annotated``
write ``Annotated[int, Field(ge=...), BeforeValidator(integral_float)]``: a
``Field`` over a nested ``Annotated`` makes pydantic emit ``ge``/``le`` into the
JSON Schema, words a client does not know, instead of ``minimum``/``maximum``."""
