"""Range and Content-Range parsing under hostile input: a range inside the volume or a client error."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.api.ranges import ByteRange, parse_content_range, parse_range
from app.errors import InvalidRange, RangeNotSatisfiable

SIZE = 1 << 20
MAX_RANGES = 8

_FUZZ = settings(max_examples=300, deadline=None)

# Numbers as a client may spell them: small, around the volume's end, past 2^64, past
# int()'s 4300-digit limit, zero-padded, signed, or in non-ASCII digits.
_numbers = st.one_of(
    st.integers(0, 2 * SIZE).map(str),
    st.integers(0, 10**40).map(str),
    st.integers(4290, 6000).map(lambda n: "9" * n),
    st.integers(1, 30).map(lambda n: "0" * n + "1"),
    st.integers(1, 10**6).map(lambda n: f"-{n}"),
    st.integers(1, 10**6).map(lambda n: f"+{n}"),
    st.sampled_from(["\u0663", "\uff11", "\u00b2", "0x10", "1e3", "", " ", "\x00"]),
)
_specs = st.one_of(
    st.tuples(_numbers, _numbers).map("-".join),
    _numbers.map(lambda n: f"{n}-"),
    _numbers.map(lambda n: f"-{n}"),
    st.text(max_size=12),
)
_range_headers = st.one_of(
    st.text(max_size=60),
    st.tuples(
        st.sampled_from(["bytes=", "BYTES =", "bytes= ", "items=", "bytes"]),
        st.lists(_specs, min_size=0, max_size=MAX_RANGES + 2),
    ).map(lambda t: t[0] + ",".join(t[1])),
)
_content_ranges = st.one_of(
    st.text(max_size=60),
    st.tuples(
        st.sampled_from(["bytes ", "bytes  ", "Bytes ", "bytes=", ""]),
        _numbers,
        _numbers,
        st.one_of(st.just("*"), _numbers, st.just(str(SIZE))),
    ).map(lambda t: f"{t[0]}{t[1]}-{t[2]}/{t[3]}"),
)


def inside(byte_range: ByteRange) -> bool:
    return 0 <= byte_range.first <= byte_range.last < SIZE


@_FUZZ
@given(_range_headers)
def test_any_range_header_gives_ranges_inside_the_volume_none_or_a_client_error(
    header: str,
) -> None:
    with contextlib.suppress(InvalidRange, RangeNotSatisfiable):
        ranges = parse_range(header, SIZE, MAX_RANGES)
        if ranges is not None:
            assert 1 <= len(ranges) <= MAX_RANGES
            assert all(inside(r) for r in ranges)


@_FUZZ
@given(_content_ranges)
def test_any_content_range_gives_a_range_inside_the_volume_or_a_client_error(
    header: str,
) -> None:
    with contextlib.suppress(InvalidRange, RangeNotSatisfiable):
        assert inside(parse_content_range(header, SIZE))


@pytest.mark.parametrize(
    "header",
    [f"bytes={'1' * 5000}-", f"bytes={'7' * 5000}-{'8' * 5000}", f"bytes=-{'0' * 5000}"],
)
def test_positions_of_thousands_of_digits_are_unsatisfiable_not_a_crash(header: str) -> None:
    with pytest.raises(RangeNotSatisfiable):
        parse_range(header, SIZE, MAX_RANGES)


def test_a_suffix_of_thousands_of_digits_is_the_whole_volume() -> None:
    assert parse_range(f"bytes=-{'9' * 5000}", SIZE, MAX_RANGES) == [ByteRange(0, SIZE - 1)]


@pytest.mark.parametrize(
    "header",
    [
        f"bytes 0-{'9' * 5000}/*",
        f"bytes {'9' * 5000}-{'9' * 5001}/*",
        f"bytes 0-0/{'1' * 5000}",
    ],
)
def test_a_content_range_of_thousands_of_digits_is_a_416(header: str) -> None:
    with pytest.raises(RangeNotSatisfiable):
        parse_content_range(header, SIZE)


@pytest.mark.parametrize("header", ["bytes=\u0660-\u0663", "bytes=\uff11-\uff12"])
def test_non_ascii_digits_are_not_a_range(header: str) -> None:
    assert parse_range(header, SIZE, MAX_RANGES) is None


@pytest.mark.parametrize(
    "header", ["bytes \u0660-\u0663/*", "bytes -1-3/*", "bytes 0--1/*", "bytes 0-1/-5", "bytes 0-1"]
)
def test_malformed_content_ranges_are_a_400(header: str) -> None:
    with pytest.raises(InvalidRange):
        parse_content_range(header, SIZE)
