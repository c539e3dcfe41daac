"""multipart/byteranges PUT bodies: parts by their Content-Range, all checked before any is used."""

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.api.multipart import BodyPart, multipart_boundary, parse_byteranges_body
from app.api.ranges import ByteRange
from app.errors import InvalidRange, PayloadTooLarge, RangeNotSatisfiable

SIZE = 1 << 20
BOUNDARY = "b0undary"


def body(*parts: tuple[str | None, bytes], boundary: str = BOUNDARY, extra: str = "") -> bytes:
    out = b""
    for content_range, data in parts:
        out += f"--{boundary}\r\n".encode()
        out += f"Content-Type: application/octet-stream\r\n{extra}".encode()
        if content_range is not None:
            out += f"Content-Range: {content_range}\r\n".encode()
        out += b"\r\n" + data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def parse(raw: bytes, max_parts: int = 256) -> list[BodyPart]:
    return parse_byteranges_body(memoryview(raw), BOUNDARY, SIZE, max_parts=max_parts)


def test_parts_come_back_in_body_order_with_their_ranges():
    parts = parse(body(("bytes 4096-4100/*", b"hello"), ("bytes 0-2/*", b"abc")))
    assert [(p.range, bytes(p.data)) for p in parts] == [
        (ByteRange(4096, 4100), b"hello"),
        (ByteRange(0, 2), b"abc"),
    ]


def test_data_containing_the_delimiter_is_taken_by_length():
    data = f"\r\n--{BOUNDARY}\r\n".encode() * 3
    (part,) = parse(body((f"bytes 0-{len(data) - 1}/*", data)))
    assert bytes(part.data) == data


def test_a_preamble_before_the_first_delimiter_is_skipped():
    (part,) = parse(b"ignored preamble\r\n" + body(("bytes 0-0/*", b"x")))
    assert bytes(part.data) == b"x"


def test_a_part_without_content_range_is_refused():
    with pytest.raises(InvalidRange, match="part 2: Content-Range is required"):
        parse(body(("bytes 0-0/*", b"x"), (None, b"y")))


@pytest.mark.parametrize("data", [b"abcd", b"ab"])
def test_a_part_whose_length_differs_from_its_content_range_is_refused(data):
    with pytest.raises(InvalidRange, match="part 1"):
        parse(body(("bytes 0-2/*", data)))


def test_a_part_beyond_the_volume_is_not_satisfiable():
    with pytest.raises(RangeNotSatisfiable):
        parse(body(("bytes 0-0/*", b"x"), (f"bytes {SIZE}-{SIZE}/*", b"y")))


def test_more_parts_than_allowed_are_refused():
    with pytest.raises(PayloadTooLarge, match="at most 2 parts"):
        parse(body(*[(f"bytes {i}-{i}/*", b"z") for i in range(3)]), max_parts=2)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"no delimiter at all",
        f"--{BOUNDARY}--\r\n".encode(),
        f"--{BOUNDARY}\r\nContent-Range: bytes 0-0/*\r\n\r\nx".encode(),
        f"--{BOUNDARY}\r\nContent-Range bytes 0-0/*\r\n\r\nx\r\n--{BOUNDARY}--".encode(),
        f"--{BOUNDARY}xx\r\n".encode(),
    ],
    ids=["empty", "no-delimiter", "no-parts", "unterminated", "bad-header", "bad-delimiter"],
)
def test_malformed_bodies_are_refused(raw):
    with pytest.raises(InvalidRange):
        parse(raw)


@pytest.mark.parametrize(
    ("content_type", "boundary"),
    [
        ("multipart/byteranges; boundary=abc", "abc"),
        ('Multipart/ByteRanges; boundary="a b"', "a b"),
        ("application/octet-stream", None),
    ],
)
def test_the_boundary_comes_from_the_content_type(content_type, boundary):
    assert multipart_boundary(content_type) == boundary


def test_multipart_without_a_boundary_is_refused():
    with pytest.raises(InvalidRange, match="boundary"):
        multipart_boundary("multipart/byteranges")


@given(
    st.lists(
        st.tuples(st.integers(0, SIZE - 64), st.binary(min_size=1, max_size=64)),
        min_size=1,
        max_size=20,
    )
)
def test_any_well_formed_body_round_trips(parts):
    raw = body(*[(f"bytes {o}-{o + len(d) - 1}/*", d) for o, d in parts])
    parsed = parse(raw)
    assert [(p.range.first, bytes(p.data)) for p in parsed] == parts


@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise_anything_but_a_client_error(raw):
    with contextlib.suppress(InvalidRange, RangeNotSatisfiable, PayloadTooLarge):
        parse(raw)


_hostile_ranges = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        [
            "bytes -1-0/*",
            f"bytes 0-{'9' * 5000}/*",
            f"bytes {'9' * 5000}-{'9' * 5000}/*",
            "bytes \u0660-\u0663/*",
            "bytes 0-0/0",
            "bytes 5-1/*",
        ]
    ),
)
_hostile_headers = st.one_of(
    st.just(""),
    st.text(max_size=40).map(lambda t: f"X-{t}: v\r\n"),
    st.sampled_from(["Content-Type: \x00\r\n", "Ümlaut: x\r\n", ": empty\r\n", "a" * 5000]),
)


@given(st.lists(st.tuples(_hostile_ranges, st.binary(max_size=16)), min_size=1, max_size=4))
def test_hostile_part_headers_are_refused_as_client_errors(parts):
    with contextlib.suppress(InvalidRange, RangeNotSatisfiable, PayloadTooLarge):
        for part in parse(body(*parts)):
            assert 0 <= part.range.first <= part.range.last < SIZE


@given(_hostile_headers, st.binary(max_size=16))
def test_hostile_extra_headers_are_refused_or_ignored(extra, data):
    raw = body((f"bytes 0-{len(data) - 1}/*" if data else "bytes 0-0/*", data or b"x"), extra=extra)
    with contextlib.suppress(InvalidRange, RangeNotSatisfiable, PayloadTooLarge):
        assert [bytes(p.data) for p in parse(raw)] == [data or b"x"]


@given(st.text(max_size=90))
def test_any_content_type_gives_an_ascii_boundary_none_or_a_400(content_type):
    try:
        boundary = multipart_boundary(content_type)
    except InvalidRange:
        return
    if boundary is not None:
        assert 1 <= len(boundary) <= 70
        boundary.encode("ascii")


@pytest.mark.parametrize("boundary", ["café", "a\x00b", "ends with space "])
def test_a_boundary_outside_rfc_2046s_characters_is_a_400(boundary):
    with pytest.raises(InvalidRange, match="boundary"):
        multipart_boundary(f'multipart/byteranges; boundary="{boundary}"')
