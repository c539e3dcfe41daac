"""Properties: round trip, refusal only through InvalidInput, keys never in errors."""

from __future__ import annotations

import contextlib
import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from app.dm.table import TableLimits, format_table, normalize, parse_table, redact
from app.errors import InvalidInput, TableError

_FAST = settings(max_examples=150, deadline=None)
_FLAGS = (
    "allow_discards",
    "same_cpu_crypt",
    "submit_from_crypt_cpus",
    "no_read_workqueue",
    "no_write_workqueue",
    "iv_large_sectors",
)
_CIPHERS = {"aes-xts-plain64": (32, 48, 64), "aes-cbc-essiv:sha256": (16, 24, 32)}

_spaces = st.sampled_from([" ", "  ", "\t", " \t "])
_names = st.from_regex(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,20}", fullmatch=True)
_devices = st.one_of(
    _names, _names.map(lambda name: f"/dev/{name}"), _names.map(lambda name: f"/dev/mapper/{name}")
)


@st.composite
def _keys(draw: st.DrawFn, size: int) -> str:
    key = draw(st.binary(min_size=size, max_size=size)).hex()
    return key.upper() if draw(st.booleans()) else key


@st.composite
def _crypt_args(draw: st.DrawFn, units: int) -> tuple[str, int]:
    """Returns the argument words and the sector_size they pick, in 512-byte units."""
    cipher = draw(st.sampled_from(sorted(_CIPHERS)))
    key = draw(_keys(draw(st.sampled_from(_CIPHERS[cipher]))))
    sector_units = units
    iv_offset = draw(st.integers(0, 1000)) * sector_units
    words = [cipher, key, str(iv_offset), draw(_devices), str(draw(st.integers(0, 2**40)))]
    features = [
        draw(st.sampled_from([flag, flag.upper()]))
        for flag in draw(st.lists(st.sampled_from(_FLAGS), max_size=4))
    ]
    if units > 1 or draw(st.booleans()):
        features.append(f"sector_size:{512 * units}")
    if features or draw(st.booleans()):
        words += [str(len(features)), *features]
    return " ".join(words), units


@st.composite
def valid_tables(draw: st.DrawFn) -> str:
    """A valid table with random spacing, blank lines, comments and spellings."""
    lines, start = [], 0
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["crypt", "linear", "zero", "error"]))
        # Keep every boundary 4096-aligned so any sector_size fits anywhere.
        length = 8 * draw(st.integers(1, 10_000))
        if kind == "crypt":
            args, _ = draw(_crypt_args(draw(st.sampled_from([1, 2, 4, 8]))))
        elif kind == "linear":
            args = f"{draw(_devices)} {draw(st.integers(0, 2**40))}"
        else:
            args = ""
        space = draw(_spaces)
        line = space.join(word for word in (str(start), str(length), kind, args) if word)
        lines.append(draw(_spaces) + line + draw(st.sampled_from(["", " ", "\r"])))
        if draw(st.booleans()):
            lines.append(draw(st.sampled_from(["", "   ", "# note"])))
        start += length
    return "\n".join(lines)


@_FAST
@given(valid_tables())
def test_formatted_table_parses_back_to_the_same_text(text: str) -> None:
    normalized = normalize(text)
    assert format_table(parse_table(normalized), show_keys=True) == normalized


@_FAST
@given(valid_tables())
def test_hidden_and_shown_formats_agree_outside_keys(text: str) -> None:
    table = parse_table(text)
    shown = format_table(table, show_keys=True)
    hidden = format_table(table)
    assert len(shown) == len(hidden)
    assert hidden.count("\n") == len(table.lines)


@_FAST
@given(valid_tables())
def test_lines_cover_the_table_contiguously_from_zero(text: str) -> None:
    table = parse_table(text)
    assert table.lines[0].start == 0
    for previous, line in zip(table.lines, table.lines[1:], strict=False):
        assert line.start == previous.start + previous.length


_table_alphabet = st.sampled_from(
    [*"0123456789 \t\n-:/#abcdefxyz.", "crypt", "linear", "zero", "error", "aes-xts-plain64"]
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=80), st.lists(_table_alphabet, max_size=40).map("".join)))
def test_arbitrary_text_is_parsed_or_refused_as_invalid_input(text: str) -> None:
    with contextlib.suppress(InvalidInput):
        parse_table(text)


_MUTATIONS = [
    lambda key: f"0 8 crypt aes-xts-plain64 {key[:-2]} 0 sda 0",
    lambda key: f"0 8 crypt aes-xts-plain64 {key}0 0 sda 0",
    lambda key: f"0 8 crypt aes-cbc-essiv:sha256 {key} 0 sda 0",
    lambda key: f"0 8 crypt aes-xts-plain64 {key} x sda 0",
    lambda key: f"0 8 crypt aes-xts-plain64 {key} 0 {key} 0 1 bogus",
    lambda key: f"0 8 crypt aes-xts-plain64 {key} 0 sda 0 1 {key}",
    lambda key: f"0 8 crypt {key} aes-xts-plain64 0 sda 0",
    lambda key: f"0 8 {key} aes-xts-plain64 0 sda 0",
    lambda key: f"0 {key} crypt aes-xts-plain64 {key} 0 sda 0",
    lambda key: f"0 8 linear {key} 0\n8 8 linear sda {key}",
    lambda key: f"8 8 crypt aes-xts-plain64 {key} 0 sda 0",
    lambda key: f"0 8 crypt serpent-xts-plain64 {key} 0 sda 0",
    lambda key: f"0 8 crypt aes-xts-plain64 {key} 4 sda 0 1 sector_size:4096",
]


@_FAST
@given(st.binary(min_size=64, max_size=64), st.sampled_from(_MUTATIONS), st.booleans())
def test_errors_never_contain_the_key(raw: bytes, mutation, upper: bool) -> None:
    key = raw.hex().upper() if upper else raw.hex()
    try:
        parse_table(mutation(key))
    except TableError as error:
        message = str(error).lower()
        chunks = {key.lower()[index : index + 16] for index in range(0, len(key) - 15)}
        assert not any(chunk in message for chunk in chunks if chunk.strip("0"))
    else:
        raise AssertionError("mutation should have been refused")


@_FAST
@given(st.binary(min_size=32, max_size=64))
def test_redacted_text_never_contains_the_key(raw: bytes) -> None:
    assume(raw.strip(b"\0"))
    key = raw.hex()
    redacted = redact(f"0 8 crypt aes-xts-plain64 {key} 0 sda 0\nnoise {key} more")
    assert key not in redacted
    assert not re.search(r"[1-9a-f]{16,}", redacted)


def _target_lines(text: str) -> list[str]:
    stripped = (raw.strip(" \t\r\f\v") for raw in text.split("\n"))
    return [line for line in stripped if line and not line.startswith("#")]


@_FAST
@given(valid_tables(), st.integers(1, 5), st.integers(10, 300))
def test_limits_refuse_exactly_the_tables_beyond_them(
    text: str, max_lines: int, max_line_length: int
) -> None:
    lines = _target_lines(text)
    limits = TableLimits(max_lines, max_line_length)
    within = len(lines) <= max_lines and all(len(line) <= max_line_length for line in lines)
    if within:
        assert parse_table(text, limits=limits) == parse_table(text)
        return
    with pytest.raises(TableError, match="REQCRYPT_MAX_TABLE_LINE") as refused:
        parse_table(text, limits=limits)
    assert refused.value.field in ("table", "line")


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(st.text(max_size=400), st.lists(_table_alphabet, max_size=200).map("".join)),
    st.integers(1, 3),
    st.integers(1, 40),
)
def test_with_limits_any_text_is_still_parsed_or_refused_as_invalid_input(
    text: str, max_lines: int, max_line_length: int
) -> None:
    with contextlib.suppress(InvalidInput):
        table = parse_table(text, limits=TableLimits(max_lines, max_line_length))
        assert len(table.lines) <= max_lines


def test_a_huge_line_count_is_refused_at_the_first_line_past_the_limit() -> None:
    text = "\n".join(f"{i * 8} 8 zero" for i in range(200_000))
    with pytest.raises(TableError) as refused:
        parse_table(text, limits=TableLimits(1024, 4096))
    assert (refused.value.line, refused.value.field) == (1025, "table")
