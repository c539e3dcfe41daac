"""``multipart/byteranges`` request bodies: several writes in one PUT, pure functions.

Each part's length comes from its own ``Content-Range``, so a part is taken by
length, not by searching for the boundary: binary data that happens to contain
the delimiter cannot cut a part short. Every part is checked before any is
returned, so a malformed batch writes nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.api.ranges import ByteRange, parse_content_range
from app.errors import InvalidRange, PayloadTooLarge

_BOUNDARY = re.compile(r';\s*boundary=(?:"([^"]{1,70})"|([^\s;"]{1,70}))', re.IGNORECASE)
# RFC 2046 §5.1.1 bchars: a boundary is ASCII, so it can be searched for in the body's bytes.
_BCHARS = re.compile(r"[0-9A-Za-z'()+_,\-./:=? ]*[0-9A-Za-z'()+_,\-./:=?]", re.ASCII)
_HEADER_END = b"\r\n\r\n"
_MAX_HEADER_BYTES = 4096


@dataclass(frozen=True, slots=True)
class BodyPart:
    range: ByteRange
    data: memoryview


def multipart_boundary(content_type: str) -> str | None:
    """The boundary of a ``multipart/byteranges`` Content-Type; None for any other type."""
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type != "multipart/byteranges":
        return None
    match = _BOUNDARY.search(content_type)
    if match is None:
        raise InvalidRange("multipart/byteranges needs a boundary parameter of 1-70 characters")
    boundary = match[1] or match[2]
    if not _BCHARS.fullmatch(boundary):
        raise InvalidRange(
            "the multipart boundary may hold only letters, digits and '()+_,-./:=? (RFC 2046)"
        )
    return boundary


def _headers(block: bytes, index: int) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in block.split(b"\r\n"):
        name, colon, value = line.partition(b":")
        if not colon or not name.strip():
            raise InvalidRange(f"part {index}: malformed header line")
        try:
            headers[name.strip().decode("ascii").lower()] = value.strip().decode("ascii")
        except UnicodeDecodeError:
            raise InvalidRange(f"part {index}: header is not ASCII") from None
    return headers


def parse_byteranges_body(
    body: memoryview, boundary: str, size: int, *, max_parts: int
) -> list[BodyPart]:
    """Split a PUT body into parts, in body order; raise before returning anything.

    InvalidRange (400) for a malformed body, a part without Content-Range or with a
    length that does not match it; RangeNotSatisfiable (416) for a part beyond the
    volume; PayloadTooLarge (413) for more than ``max_parts`` parts.
    """
    delimiter = b"--" + boundary.encode("ascii")
    # A short preamble before the first delimiter is allowed (RFC 2046 §5.1.1).
    head = bytes(body[: _MAX_HEADER_BYTES + len(delimiter)])
    if head.startswith(delimiter):
        position = 0
    else:
        found = head.find(b"\r\n" + delimiter)
        if found < 0:
            raise InvalidRange("multipart body has no delimiter line for its boundary")
        position = found + 2
    parts: list[BodyPart] = []
    while True:
        position += len(delimiter)
        marker = bytes(body[position : position + 2])
        if marker == b"--":
            break
        if marker != b"\r\n":
            raise InvalidRange(f"part {len(parts) + 1}: delimiter line not followed by CRLF")
        position += 2
        index = len(parts) + 1
        if index > max_parts:
            raise PayloadTooLarge(f"at most {max_parts} parts per request")
        window = bytes(body[position : position + _MAX_HEADER_BYTES + len(_HEADER_END)])
        end = window.find(_HEADER_END)
        if end < 0:
            raise InvalidRange(f"part {index}: headers do not end with an empty line")
        headers = _headers(window[:end], index) if end else {}
        position += end + len(_HEADER_END)
        if "content-range" not in headers:
            raise InvalidRange(f"part {index}: Content-Range is required")
        byte_range = parse_content_range(headers["content-range"], size)
        data = body[position : position + byte_range.length]
        if len(data) != byte_range.length:
            raise InvalidRange(
                f"part {index}: body ends before the {byte_range.length} bytes of its Content-Range"
            )
        position += byte_range.length
        if bytes(body[position : position + 2 + len(delimiter)]) != b"\r\n" + delimiter:
            raise InvalidRange(
                f"part {index}: data is not followed by a delimiter line: its length "
                f"does not match Content-Range {byte_range.first}-{byte_range.last}"
            )
        position += 2
        parts.append(BodyPart(byte_range, data))
    if not parts:
        raise InvalidRange("multipart body has no parts")
    return parts
