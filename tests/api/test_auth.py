import pytest
from pydantic import ValidationError

from app.config import Settings

pytestmark = pytest.mark.anyio


def test_auth_cannot_be_disabled_on_a_public_address() -> None:
    with pytest.raises(ValidationError, match="loopback"):
        Settings(auth="disabled", host="0.0.0.0")


def test_auth_can_be_disabled_on_loopback() -> None:
    assert Settings(auth="disabled", host="127.0.0.1").auth == "disabled"


def test_short_tokens_are_refused() -> None:
    with pytest.raises(ValidationError, match="at least 16"):
        Settings(admin_token="short")  # type: ignore[arg-type]


def test_malformed_master_key_is_refused() -> None:
    with pytest.raises(ValidationError, match="64 hex digits"):
        Settings(master_key="abcd")  # type: ignore[arg-type]
