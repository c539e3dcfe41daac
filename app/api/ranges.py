"""RFC 9110 byte ranges: parse ``Range`` and ``Content-Range``, pure functions."""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.errors import InvalidRange, RangeNotSatisfiable

_SPEC = re.compile(r"^\s*(\d*)\s*-\s*(\d*)\s*$", re.ASCII)
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$", re.ASCII)
_BEYOND = 1 << 64
"""Stands for any position of more than 20 digits: past every volume, and never handed
to ``int()``, which refuses strings of over 4300 digits (a 500, not the client's error)."""


def _position(digits: str) -> int:
    significant = digits.lstrip("0")
    return int(significant or "0") if len(significant) <= 20 else _BEYOND


def content_length(value: bytes) -> int | None:
    """A Content-Length header's value (None when it is not digits), never handed whole to
    ``int()``: thousands of leading zeros are digits too."""
    if not value.isdigit():
        return None
    return _position(value.decode("ascii"))


@dataclass(frozen=True, slots=True)
class ByteRange:
    first: int
    last: int

    @property
    def length(self) -> int:
        return self.last - self.first + 1

    def content_range(self, size: int) -> str:
        return f"bytes {self.first}-{self.last}/{size}"


def parse_range(header: str, size: int, max_ranges: int) -> list[ByteRange] | None:
    """Satisfiable ranges of a ``Range`` header; None when it is not a bytes range (ignore it).

    Raises RangeNotSatisfiable when no range overlaps the volume (416), InvalidRange
    for more than ``max_ranges`` ranges (400).
    """
    unit, _, specs = header.partition("=")
    if unit.strip().lower() != "bytes" or not specs.strip():
        return None
    ranges: list[ByteRange] = []
    parts = specs.split(",")
    if len(parts) > max_ranges:
        raise InvalidRange(f"at most {max_ranges} ranges per request (REQCRYPT_MAX_RANGES)")
    for part in parts:
        match = _SPEC.match(part)
        if match is None or (not match[1] and not match[2]):
            return None  # syntactically invalid: RFC 9110 says ignore the header
        if match[1]:
            first = _position(match[1])
            last = _position(match[2]) if match[2] else size - 1
            if match[2] and last < first:
                return None
            if first >= size:
                continue
            ranges.append(ByteRange(first, min(last, size - 1)))
        else:
            suffix = _position(match[2])
            if suffix == 0:
                continue
            ranges.append(ByteRange(max(0, size - suffix), size - 1))
    if not ranges:
        raise RangeNotSatisfiable(
            f"no range of {header!r} lies within the {size}-byte volume", size
        )
    return ranges


def parse_content_range(header: str | None, size: int) -> ByteRange:
    """A write's ``Content-Range: bytes a-b/*`` (or ``/<size>``)."""
    if header is None:
        raise InvalidRange("PUT needs Content-Range: bytes <first>-<last>/* (RFC 9110 §14.5)")
    match = _CONTENT_RANGE.match(header.strip())
    if match is None:
        raise InvalidRange("Content-Range must be 'bytes <first>-<last>/<size or *>'")
    first, last = _position(match[1]), _position(match[2])
    if last < first:
        raise InvalidRange("Content-Range last byte is before the first")
    if match[3] != "*" and _position(match[3]) != size:
        raise RangeNotSatisfiable(
            f"Content-Range complete length {match[3]} is not the volume size {size}", size
        )
    if last >= size:
        raise RangeNotSatisfiable(f"bytes {first}-{last} lie beyond the {size}-byte volume", size)
    return ByteRange(first, last)
