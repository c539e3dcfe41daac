"""Sizes as people write them (fio's grammar): ``4k``, ``512KiB``, ``1M``, ``1.5G``, plain bytes."""

from __future__ import annotations

import re
from fractions import Fraction

from app.errors import InvalidInput

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str | int) -> int:
    """fio sizes: ``4k``, ``512KiB``, ``1M``, ``1.5G``, plain bytes; powers of two like fio's.

    A fraction is exact (``Fraction``, not float) and must come to whole bytes.
    """
    if isinstance(text, int):
        return text
    match = _SIZE_RE.match(text)
    if match is None:
        raise InvalidInput(f"size {text!r}: expected a number with an optional k/m/g suffix")
    nbytes = Fraction(match.group(1)) * _UNITS[match.group(2).lower()]
    if nbytes.denominator != 1:
        raise InvalidInput(f"size {text!r}: not a whole number of bytes")
    return int(nbytes)


def format_size(nbytes: int) -> str:
    """``4k``, ``512k``, ``1M``: the short form the kernel thread's tables use."""
    for suffix, unit in (("G", 1 << 30), ("M", 1 << 20), ("k", 1 << 10)):
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit}{suffix}"
    return str(nbytes)
