"""Every corpus entry: valid text normalizes as expected, invalid text is refused where expected."""

from __future__ import annotations

import re

import pytest

from app.dm.table import format_table, normalize, parse_table
from app.errors import TableError
from tests.unit.dm.table_corpus import INVALID, VALID, Refused

_HEX_RUN = re.compile(r"[0-9a-f]{16,}")


@pytest.mark.parametrize(("text", "expected"), VALID)
def test_valid_table_normalizes_to_expected_text(text: str, expected: str) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(("text", "expected"), VALID)
def test_normalized_text_is_a_fixed_point(text: str, expected: str) -> None:
    assert normalize(expected) == expected


@pytest.mark.parametrize(("text", "expected"), VALID)
def test_hidden_keys_print_as_zeros_of_the_same_length(text: str, expected: str) -> None:
    hidden = format_table(parse_table(text))
    assert len(hidden) == len(expected)
    for shown_line, hidden_line in zip(expected.splitlines(), hidden.splitlines(), strict=True):
        shown_words, hidden_words = shown_line.split(" "), hidden_line.split(" ")
        if shown_words[2] == "crypt" and shown_words[4] != "-":
            assert hidden_words[4] == "0" * len(shown_words[4])
            hidden_words[4] = shown_words[4]
        assert hidden_words == shown_words


@pytest.mark.parametrize(("text", "refused"), INVALID)
def test_invalid_table_is_refused_at_the_expected_line_and_field(
    text: str, refused: Refused
) -> None:
    with pytest.raises(TableError) as caught:
        parse_table(text)
    error = caught.value
    assert (error.line, error.field) == (refused.line, refused.field)
    assert refused.reason in error.reason
    assert str(error) == f"line {error.line}: {error.field}: {error.reason}"


@pytest.mark.parametrize(("text", "refused"), INVALID)
def test_refusal_never_quotes_a_long_hex_run(text: str, refused: Refused) -> None:
    with pytest.raises(TableError) as caught:
        parse_table(text)
    assert not _HEX_RUN.search(str(caught.value).lower().replace("0" * 16, ""))
