"""Request and response models of the LUKS routes. Passphrases are ``SecretStr``: never in a
repr or a log line, and validation errors name only their location."""

from __future__ import annotations

import base64
import binascii
from dataclasses import fields
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict

from app.integers import integral_float
from app.luks.device import FormatOptions, PbkdfOptions
from app.vocab import NAME_PATTERN

MAX_PASSPHRASE = 512
"""cryptsetup's interactive passphrase limit (characters)."""
MAX_KEY_FILE_BASE64 = 4 * (8 << 20) // 3 + 4
"""A key file of up to 8 MiB (cryptsetup's default ``--keyfile-size`` ceiling), in base64."""

MAX_ITER_TIME_MS = 60_000
"""The longest ``iter_time_ms`` asked for (the cost ceilings cap it further)."""

Count = Annotated[int, Field(ge=1, le=1 << 32), BeforeValidator(integral_float)]


def given(field: str) -> JsonDict:
    """JSON Schema for "``field`` is present and not null"."""
    return {"required": [field], "properties": {field: {"type": "string"}}}


PASSPHRASE_ONE_OF: JsonDict = {"oneOf": [given("passphrase"), given("key_file")]}
PASSPHRASE_NOT_BOTH: JsonDict = {
    "not": {
        "required": ["passphrase", "key_file"],
        "properties": {"passphrase": {"type": "string"}, "key_file": {"type": "string"}},
    }
}


def utf8(text: SecretStr, field: str) -> bytes:
    """The UTF-8 bytes the PBKDF hashes. JSON may escape a lone surrogate (``"\\ud800"``),
    which no UTF-8 text holds: refused as invalid input, not left to fail mid-request."""
    try:
        return text.get_secret_value().encode()
    except UnicodeEncodeError:
        raise ValueError(f"{field} is not valid UTF-8 text (a lone surrogate)") from None


class OptionalSecret(BaseModel):
    """A passphrase, or a key file's bytes in base64: at most one."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=PASSPHRASE_NOT_BOTH)

    passphrase: SecretStr | None = Field(
        default=None, min_length=1, max_length=MAX_PASSPHRASE, description="UTF-8 text"
    )
    key_file: SecretStr | None = Field(
        default=None,
        min_length=4,
        max_length=MAX_KEY_FILE_BASE64,
        description="the key file's bytes, base64 (as `cryptsetup --key-file`)",
    )

    @field_validator("passphrase")
    @classmethod
    def _text(cls, passphrase: SecretStr | None) -> SecretStr | None:
        if passphrase is not None:
            utf8(passphrase, "passphrase")
        return passphrase

    @model_validator(mode="after")
    def _at_most_one(self) -> OptionalSecret:
        if self.passphrase is not None and self.key_file is not None:
            raise ValueError("give one of passphrase and key_file, not both")
        if self.key_file is not None:
            try:
                base64.b64decode(self.key_file.get_secret_value(), validate=True)
            except (binascii.Error, ValueError):
                raise ValueError("key_file is not base64") from None
        return self

    def optional_secret(self) -> bytearray | None:
        """The bytes the PBKDF hashes, if given; the caller zeroes them after use."""
        if self.passphrase is not None:
            return bytearray(utf8(self.passphrase, "passphrase"))
        if self.key_file is not None:
            return bytearray(base64.b64decode(self.key_file.get_secret_value(), validate=True))
        return None


class Secret(OptionalSecret):
    """Exactly one of a passphrase and a key file."""

    model_config = ConfigDict(json_schema_extra=PASSPHRASE_ONE_OF)

    @model_validator(mode="after")
    def _one(self) -> Secret:
        if self.passphrase is None and self.key_file is None:
            raise ValueError("give one of passphrase and key_file")
        return self

    def secret(self) -> bytearray:
        given = self.optional_secret()
        assert given is not None
        return given


class PbkdfIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["argon2id", "argon2i", "pbkdf2"] | None = Field(
        default=None, description="default: argon2id (LUKS2), pbkdf2 (LUKS1)"
    )
    hash: Literal["sha1", "sha256", "sha512"] = Field(
        default="sha256", description="PBKDF2 hash; also the AF and digest hash, as --hash"
    )
    iterations: Count | None = Field(
        default=None, description="PBKDF2 iterations, or Argon2 passes (time cost, at least 4)"
    )
    memory_kib: Count | None = Field(default=None, description="Argon2 memory (KiB)")
    parallel: Annotated[int, Field(ge=1, le=1024), BeforeValidator(integral_float)] | None = Field(
        default=None, description="Argon2 threads"
    )
    iter_time_ms: (
        Annotated[int, Field(ge=1, le=MAX_ITER_TIME_MS), BeforeValidator(integral_float)] | None
    ) = Field(
        default=None,
        description=(
            "as cryptsetup --iter-time (whose default is 2000): the derivation is timed on the "
            "serving node and takes about this many milliseconds there: PBKDF2 iterations, or "
            "Argon2 passes (and memory, when memory_kib is not given), within "
            "REQCRYPT_LUKS_MAX_PBKDF_*; not with iterations. Without it the fixed defaults "
            "apply: PBKDF2 1000000 iterations; Argon2 4 passes, 1048576 KiB, min(4, CPUs) threads"
        ),
    )

    def options(self) -> PbkdfOptions:
        return PbkdfOptions(**self.model_dump())


class LuksFormatIn(Secret):
    type: Literal["luks2", "luks1"] = "luks2"
    cipher: str = Field(default="aes-xts-plain64", min_length=1, max_length=64)
    key_size: Literal[128, 256, 384, 512] = Field(default=512, description="bits")
    sector_size: Literal[512, 1024, 2048, 4096] = 512
    pbkdf: PbkdfIn = Field(default_factory=PbkdfIn)
    label: str = Field(default="", max_length=47, pattern=r"^[ -~]*$")

    def options(self) -> FormatOptions:
        plain = {field.name for field in fields(FormatOptions)} - {"pbkdf"}
        return FormatOptions(**self.model_dump(include=plain), pbkdf=self.pbkdf.options())


class LuksKeyslotIn(Secret):
    new_passphrase: SecretStr = Field(min_length=1, max_length=MAX_PASSPHRASE)
    pbkdf: PbkdfIn = Field(default_factory=PbkdfIn)

    @field_validator("new_passphrase")
    @classmethod
    def _new_text(cls, new_passphrase: SecretStr) -> SecretStr:
        utf8(new_passphrase, "new_passphrase")
        return new_passphrase

    def new_secret(self) -> bytearray:
        """The new passphrase's bytes; the caller zeroes them after use."""
        return bytearray(utf8(self.new_passphrase, "new_passphrase"))


class LuksKillIn(OptionalSecret):
    """A passphrase or key file of another keyslot (none needed for the last one, with force)."""

    force: bool = Field(default=False, description="kill the last keyslot: the data is lost")


class LuksOpenIn(Secret):
    device: str = Field(pattern=NAME_PATTERN, examples=["sda2"])
    allow_discards: bool = Field(default=False, description="as cryptsetup --allow-discards")


class LuksKeyslotOut(BaseModel):
    slot: int
    key_size: int = Field(description="bits")
    cipher: str
    priority: int = Field(description="LUKS2: 0 ignore, 1 normal, 2 prefer")
    pbkdf: dict[str, Any]
    af_stripes: int
    af_hash: str
    area_offset: int
    area_size: int


class LuksTokenOut(BaseModel):
    id: int
    type: str
    keyslots: list[int]


class LuksDumpOut(BaseModel):
    """luksDump: never key material, salts or digests."""

    version: Literal[1, 2]
    uuid: str
    label: str
    subsystem: str
    cipher: str
    key_size: int = Field(description="bits; 0 when no keyslot is left to tell")
    sector_size: int
    data_offset: int = Field(description="bytes")
    data_length: int = Field(description="bytes")
    epoch: int | None = Field(description="LUKS2 sequence id")
    metadata_size: int | None = Field(description="LUKS2 hdr_size")
    keyslots_size: int | None
    header_copy: Literal["primary", "secondary"] = Field(
        description="the copy in use: secondary when the primary is corrupt"
    )
    flags: list[str] = Field(description="LUKS2 persistent flags (allow-discards…)")
    keyslots: list[LuksKeyslotOut]
    digest: dict[str, Any]
    tokens: list[LuksTokenOut] = Field(description="kept as stored; never run")


class LuksKeyslotAddedOut(BaseModel):
    slot: int
    dump: LuksDumpOut
