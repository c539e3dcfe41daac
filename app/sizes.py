"""Sizes as people write them (fio's grammar): ``4k``, ``512KiB``, ``1M``, plain bytes."""

from __future__ import annotations

import re

from app.errors import InvalidInput

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str | int) -> int:
    """fio sizes: ``4k``, ``512KiB``, ``1M``, plain bytes; powers of two like fio's default."""
    if isinstance(text, int):
        return text
    match = _SIZE_RE.match(text)
    if match is None:
        raise InvalidInput(f"size {text!r}: expected a number with an optional k/m/g suffix")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def format_size(nbytes: int) -> str:
    """``4k``, ``512k``, ``1M``: the short form the kernel thread's tables use."""
    for suffix, unit in (("G", 1 << 30), ("M", 1 << 20), ("k", 1 << 10)):
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit}{suffix}"
    return str(nbytes)
