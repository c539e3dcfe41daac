"""The typed model, device references, range checks, formatting and redaction."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from app.crypto.keys import KeyMaterial
from app.dm.table import (
    CryptParams,
    DeviceRef,
    ErrorParams,
    LinearParams,
    ZeroParams,
    format_table,
    parse_table,
    redact,
)
from app.errors import DeviceNotFound, InvalidInput, TableError, VolumeNotFound
from tests.unit.dm.table_corpus import K64, XTS

MIXED = (
    f"0 8 crypt {XTS} {K64} 0 /dev/sda2 8 1 allow_discards\n"
    "8 16 linear /dev/mapper/lower 0\n"
    "24 8 zero\n"
    "32 8 error\n"
    "40 8 linear sda2 100\n"
)


@dataclass
class FakeResolver:
    sizes: dict[DeviceRef, int] = field(default_factory=dict)

    def device_size_sectors(self, ref: DeviceRef) -> int:
        if ref not in self.sizes:
            raise (VolumeNotFound if ref.kind == "volume" else DeviceNotFound)(ref.name)
        return self.sizes[ref]


def test_parse_builds_typed_lines() -> None:
    table = parse_table(MIXED)
    crypt, linear, zero, error, _ = table.lines
    assert isinstance(crypt.target, CryptParams)
    assert crypt.target.cipher.format() == XTS
    assert crypt.target.key is not None
    assert crypt.target.key.hex() == K64
    assert (crypt.target.iv_offset, crypt.target.offset, crypt.target.sector_size) == (0, 8, 512)
    assert crypt.target.allow_discards
    assert not crypt.target.same_cpu_crypt
    assert linear.target == LinearParams(DeviceRef("volume", "lower"), 0)
    assert zero.target == ZeroParams()
    assert error.target == ErrorParams()
    assert [line.target_type for line in table.lines] == [
        "crypt",
        "linear",
        "zero",
        "error",
        "linear",
    ]


def test_size_is_the_end_of_the_last_line() -> None:
    assert parse_table(MIXED).size_sectors == 48


def test_targets_of_type_keeps_table_order() -> None:
    lines = parse_table(MIXED).targets_of_type("linear")
    assert [line.start for line in lines] == [8, 40]


def test_devices_lists_each_backing_object_once() -> None:
    table = parse_table(MIXED)
    assert table.devices() == {"sda2", "/dev/mapper/lower"}
    assert table.volume_names() == {"lower"}


def test_device_spellings_compare_equal_but_print_as_written() -> None:
    short, long = DeviceRef.parse("sda2"), DeviceRef.parse("/dev/sda2")
    assert short == long
    assert hash(short) == hash(long)
    assert (short.format(), long.format()) == ("sda2", "/dev/sda2")


def test_device_ref_defaults_its_spelling_from_kind() -> None:
    assert DeviceRef("volume", "v1").format() == "/dev/mapper/v1"
    assert DeviceRef("device", "sdb").format() == "sdb"


def test_device_ref_refuses_text_naming_another_object() -> None:
    with pytest.raises(InvalidInput):
        DeviceRef("device", "sda", "/dev/mapper/sda")


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "n" * 65, "sp ace"])
def test_device_ref_refuses_bad_names(name: str) -> None:
    with pytest.raises(InvalidInput):
        DeviceRef("device", name)


def test_format_hides_keys_by_default() -> None:
    text = format_table(parse_table(MIXED))
    assert K64 not in text
    assert f"{XTS} {'0' * len(K64)} 0 /dev/sda2 8 1 allow_discards\n" in text


def test_format_shows_lowercase_keys_when_asked() -> None:
    table = parse_table(MIXED.replace(K64, K64.upper()))
    assert K64 in format_table(table, show_keys=True)


def test_format_ends_every_line_with_a_newline() -> None:
    assert format_table(parse_table(MIXED)).count("\n") == 5


def test_empty_key_prints_as_dash_even_when_hidden() -> None:
    table = parse_table("0 8 crypt cipher_null-ecb - 0 sda 0")
    assert format_table(table) == "0 8 crypt cipher_null-ecb - 0 sda 0\n"


def test_wiped_key_prints_as_dash_not_as_an_empty_field() -> None:
    key = KeyMaterial.from_hex(K64)
    table = parse_table(MIXED)
    crypt = table.lines[0].target
    assert isinstance(crypt, CryptParams)
    wiped = CryptParams(crypt.cipher, key, 0, crypt.device, 8)
    key.wipe()
    assert wiped.format().split(" ")[1] == "-"


def test_repr_of_parsed_table_never_shows_the_key() -> None:
    assert K64 not in repr(parse_table(MIXED))


def test_resolver_accepts_ranges_inside_the_device() -> None:
    resolver = FakeResolver({DeviceRef("device", "sda2"): 148, DeviceRef("volume", "lower"): 16})
    assert parse_table(MIXED, resolve=resolver).size_sectors == 48


def test_resolver_refuses_a_range_past_the_device_end() -> None:
    resolver = FakeResolver({DeviceRef("device", "sda2"): 2048})
    text = f"0 8 zero\n8 4096 crypt {XTS} {K64} 0 sda2 8"
    with pytest.raises(TableError) as caught:
        parse_table(text, resolve=resolver)
    assert str(caught.value) == (
        'line 2: crypt: device: device "sda2" is 2048 sectors; target needs offset 8 + length 4096'
    )


@pytest.mark.parametrize("device", ["sdz", "/dev/mapper/missing"])
def test_resolver_lookup_failure_becomes_a_table_error(device: str) -> None:
    with pytest.raises(TableError, match="Device lookup failed") as caught:
        parse_table(f"0 8 linear {device} 0", resolve=FakeResolver())
    assert caught.value.field == "linear: device"


def test_table_error_is_invalid_input() -> None:
    with pytest.raises(InvalidInput):
        parse_table("0 8 bogus")


def test_redact_zeroes_the_key_word_of_a_crypt_line() -> None:
    line = f"0 8  crypt\t{XTS} {K64} 0 sda 0"
    assert redact(line) == line.replace(K64, "0" * len(K64))


def test_redact_zeroes_a_short_key_in_the_key_position() -> None:
    assert (
        redact("0 8 crypt aes-cbc-plain abcdef 0 sda 0") == "0 8 crypt aes-cbc-plain 000000 0 sda 0"
    )


def test_redact_zeroes_long_hex_runs_anywhere() -> None:
    assert redact(f"0 8 crypt {K64}") == f"0 8 crypt {'0' * len(K64)}"
    assert redact(f"key={K64[:20]};") == f"key={'0' * 20};"


def test_redact_keeps_dash_and_keyring_references() -> None:
    for key in ("-", ":32:logon:desc"):
        line = f"0 8 crypt {XTS} {key} 0 sda 0"
        assert redact(line) == line


def test_redact_keeps_line_structure() -> None:
    text = f"0 8 crypt {XTS} {K64} 0 sda 0\n\n8 8 zero\n"
    assert redact(text).split("\n")[1:] == ["", "8 8 zero", ""]


def test_logical_block_size_is_the_largest_crypt_sector_size() -> None:
    text = (
        f"0 8 crypt {XTS} {K64} 0 sda 0 1 sector_size:2048\n"
        f"8 8 crypt {XTS} {K64} 8 sda 8 1 sector_size:4096\n16 8 zero"
    )
    table = parse_table(text)
    assert table.logical_block_size == 4096
    assert [params.sector_size for params in table.crypt_params()] == [2048, 4096]


def test_logical_block_size_without_crypt_is_one_sector() -> None:
    assert parse_table("0 8 zero").logical_block_size == 512
