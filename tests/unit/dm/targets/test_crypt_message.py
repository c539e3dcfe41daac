"""The crypt target's message handler: ``key set|wipe`` planned as new parameters, kernel rules."""

from __future__ import annotations

import pytest

from app.dm.table import CryptParams, parse_table
from app.dm.targets import crypt_message
from app.errors import CipherSpecError, InvalidInput, InvalidState
from tests.support.keys import XTS_KEY

OTHER = bytes(range(64, 128)).hex()


def params() -> CryptParams:
    target = parse_table(f"0 8 crypt aes-xts-plain64 {XTS_KEY} 0 pv 0").lines[0].target
    assert isinstance(target, CryptParams)
    return target


def test_key_wipe_keeps_the_key_length_and_leaves_the_old_params_alone() -> None:
    old = params()
    wiped = crypt_message(old, ["key", "wipe"], suspended=True)
    assert wiped.key is None
    assert wiped.wiped_key_size == 64
    assert old.key is not None


def test_key_set_installs_a_checked_key() -> None:
    new = crypt_message(params(), ["key", "set", OTHER], suspended=True)
    assert new.key is not None
    assert new.key.hex() == OTHER
    with pytest.raises(CipherSpecError):
        crypt_message(params(), ["key", "set", "00" * 7], suspended=True)


def test_key_messages_need_the_target_suspended() -> None:
    with pytest.raises(InvalidState):
        crypt_message(params(), ["key", "wipe"], suspended=False)


@pytest.mark.parametrize("words", [[], ["key"], ["key", "rotate"], ["key", "wipe", "now"]])
def test_unrecognised_messages_are_refused(words: list[str]) -> None:
    with pytest.raises(InvalidInput):
        crypt_message(params(), words, suspended=True)
