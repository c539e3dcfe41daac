"""Table texts and what ``parse_table`` must do with them.

``VALID`` pairs input with its normalized form (``normalize``: keys shown).
``INVALID`` pairs input with the error: physical line number, field, and a
substring of the reason.  Keys are fixed test values, never real secrets.
"""

from __future__ import annotations

from dataclasses import dataclass

K16 = "00112233445566778899aabbccddeeff"  # 16 bytes: aes-128 cbc
K32 = "0f1e2d3c4b5a69788796a5b4c3d2e1f0" * 2  # 32 bytes: aes-256 cbc, aes-128 xts
K48 = "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf" * 3  # 48 bytes: aes-192 xts
K64 = "f0e1d2c3b4a5968778695a4b3c2d1e0f" * 4  # 64 bytes: aes-256 xts
XTS = "aes-xts-plain64"
ESSIV = "aes-cbc-essiv:sha256"


def crypt(key: str = K64, rest: str = "0 sda2 0", cipher: str = XTS, length: int = 8) -> str:
    return f"0 {length} crypt {cipher} {key} {rest}"


@dataclass(frozen=True)
class Refused:
    line: int
    field: str
    reason: str


VALID: list[tuple[str, str]] = [
    # zero and error: dmsetup prints "%llu %llu %s %s", so an empty param string
    # leaves a trailing space.
    ("0 8 zero", "0 8 zero \n"),
    ("0 8 error", "0 8 error \n"),
    ("0 2048 linear sda2 0", "0 2048 linear sda2 0\n"),
    ("0 2048 linear /dev/sda2 63", "0 2048 linear /dev/sda2 63\n"),
    ("0 2048 linear /dev/mapper/inner 8", "0 2048 linear /dev/mapper/inner 8\n"),
    ("0 8 linear disk-1.img_a 0", "0 8 linear disk-1.img_a 0\n"),
    (f"0 8 linear {'n' * 64} 0", f"0 8 linear {'n' * 64} 0\n"),
    (crypt(K64), f"{crypt(K64)}\n"),
    (crypt(K48), f"{crypt(K48)}\n"),
    (crypt(K32), f"{crypt(K32)}\n"),
    (crypt(K64.upper()), f"{crypt(K64)}\n"),
    (crypt(K32, cipher=ESSIV), f"{crypt(K32, cipher=ESSIV)}\n"),
    (crypt(K16, cipher=ESSIV), f"{crypt(K16, cipher=ESSIV)}\n"),
    (crypt(K64, cipher="capi:xts(aes)-plain64"), f"{crypt(K64, cipher='capi:xts(aes)-plain64')}\n"),
    (crypt("-", cipher="cipher_null-ecb"), f"{crypt('-', cipher='cipher_null-ecb')}\n"),
    (crypt(rest="0 sda2 0 1 allow_discards"), f"{crypt(rest='0 sda2 0 1 allow_discards')}\n"),
    (crypt(rest="0 sda2 0 0"), f"{crypt()}\n"),
    (crypt(rest="0 sda2 0 1 sector_size:512"), f"{crypt()}\n"),
    (
        crypt(rest="0 sda2 0 3 iv_large_sectors allow_discards same_cpu_crypt"),
        f"{crypt(rest='0 sda2 0 3 allow_discards same_cpu_crypt iv_large_sectors')}\n",
    ),
    (
        crypt(
            rest="8 sda2 0 7 iv_large_sectors sector_size:4096 no_write_workqueue "
            "no_read_workqueue submit_from_crypt_cpus same_cpu_crypt allow_discards"
        ),
        crypt(
            rest="8 sda2 0 7 allow_discards same_cpu_crypt submit_from_crypt_cpus "
            "no_read_workqueue no_write_workqueue sector_size:4096 iv_large_sectors"
        )
        + "\n",
    ),
    (
        crypt(rest="0 sda2 0 2 allow_discards allow_discards"),
        f"{crypt(rest='0 sda2 0 1 allow_discards')}\n",
    ),
    (
        crypt(rest="0 sda2 0 2 SAME_CPU_CRYPT No_Read_Workqueue"),
        f"{crypt(rest='0 sda2 0 2 same_cpu_crypt no_read_workqueue')}\n",
    ),
    (
        crypt(rest="0 sda2 0 2 sector_size:1024 sector_size:4096"),
        f"{crypt(rest='0 sda2 0 1 sector_size:4096')}\n",
    ),
    (crypt(rest="0 sda2 0 1 iv_large_sectors"), f"{crypt(rest='0 sda2 0 1 iv_large_sectors')}\n"),
    (crypt(rest="3 sda2 5"), f"{crypt(rest='3 sda2 5')}\n"),
    (
        crypt(rest="16 /dev/mapper/lower 24 1 sector_size:4096", length=4096),
        f"{crypt(rest='16 /dev/mapper/lower 24 1 sector_size:4096', length=4096)}\n",
    ),
    ("  0\t8   zero  ", "0 8 zero \n"),
    ("0 8 zero\r\n8 8 error\r\n", "0 8 zero \n8 8 error \n"),
    ("\n\n0 8 zero\n\n   \n8 8 zero\n\n", "0 8 zero \n8 8 zero \n"),
    ("# a comment\n0 8 zero\n  # indented comment\n8 8 error", "0 8 zero \n8 8 error \n"),
    ("00 008 zero", "0 8 zero \n"),
    ("0 18446744073709551615 zero", "0 18446744073709551615 zero \n"),
    ("0 8 linear sda 18446744073709551615", "0 8 linear sda 18446744073709551615\n"),
    (
        f"0 8 crypt {XTS} {K64} 0 sda 0\n8 2040 linear sdb 0\n2048 8 zero\n2056 8 error",
        f"0 8 crypt {XTS} {K64} 0 sda 0\n8 2040 linear sdb 0\n2048 8 zero \n2056 8 error \n",
    ),
    (
        f"0 8 crypt {XTS} {K64} 0 sda 0 1 sector_size:4096\n"
        f"8 8 crypt {XTS} {K64} 8 sda 8 1 sector_size:4096",
        f"0 8 crypt {XTS} {K64} 0 sda 0 1 sector_size:4096\n"
        f"8 8 crypt {XTS} {K64} 8 sda 8 1 sector_size:4096\n",
    ),
]

INVALID: list[tuple[str, Refused]] = [
    ("", Refused(1, "table", "empty table")),
    ("  \n\n\t\n", Refused(4, "table", "empty table")),
    ("# nothing but a comment", Refused(1, "table", "empty table")),
    ("8 8 zero", Refused(1, "start", "Gap in table: the first line must start at 0")),
    ("0 8 zero\n16 8 zero", Refused(2, "start", "Gap in table")),
    ("0 8 zero\n4 8 zero", Refused(2, "start", "overlapping the previous line")),
    ("0 8 zero\n0 8 zero", Refused(2, "start", "overlapping")),
    ("\n\n0 8 zero\n\n16 8 zero", Refused(5, "start", "Gap in table")),
    ("0 0 zero", Refused(1, "length", "zero-length target")),
    ("-1 8 zero", Refused(1, "start", "Invalid start sector")),
    ("0 -8 zero", Refused(1, "length", "Invalid length")),
    ("0 +8 zero", Refused(1, "length", "Invalid length")),
    ("0 0x8 zero", Refused(1, "length", "Invalid length")),
    ("0 8.0 zero", Refused(1, "length", "Invalid length")),
    ("0 18446744073709551616 zero", Refused(1, "length", "below 2^64")),
    ("0 " + "9" * 5000 + " zero", Refused(1, "length", "Invalid length")),
    (
        "0 18446744073709551615 zero\n18446744073709551615 1 zero",
        Refused(2, "length", "beyond sector 2^64-1"),
    ),
    ("0", Refused(1, "length", "missing")),
    ("0 8", Refused(1, "target", "missing")),
    ("0 8 striped 2 8 sda 0 sdb 0", Refused(1, "target", 'unknown target type "striped"')),
    (crypt().replace("crypt", "CRYPT"), Refused(1, "target", "unknown target type")),
    ("0 8 zero extra", Refused(1, "zero: args", "No arguments required")),
    ("0 8 error sda 0", Refused(1, "error: args", "No arguments required")),
    ("0 8 linear sda", Refused(1, "linear: args", "Invalid argument count")),
    ("0 8 linear sda 0 1", Refused(1, "linear: args", "Invalid argument count")),
    ("0 8 linear sda -1", Refused(1, "linear: offset", "Invalid device sector")),
    ("0 8 linear sda 18446744073709551616", Refused(1, "linear: offset", "Invalid device sector")),
    ("0 8 linear 8:1 0", Refused(1, "linear: device", "major:minor")),
    ("0 8 linear /tmp/disk 0", Refused(1, "linear: device", "invalid device name")),
    ("0 8 linear /dev/vg/lv 0", Refused(1, "linear: device", "invalid device name")),
    ("0 8 linear .. 0", Refused(1, "linear: device", "invalid device name")),
    ("0 8 linear /dev/. 0", Refused(1, "linear: device", "invalid device name")),
    ("0 8 linear /dev/mapper/ 0", Refused(1, "linear: device", "invalid device name")),
    (f"0 8 linear {'n' * 65} 0", Refused(1, "linear: device", "invalid device name")),
    ("0 8 linear sd\u00e9 0", Refused(1, "linear: device", "invalid device name")),
    (f"0 8 crypt {XTS} {K64} 0 sda", Refused(1, "crypt: args", "Not enough arguments")),
    ("0 8 crypt", Refused(1, "crypt: args", "Not enough arguments")),
    (
        crypt(K64[:62]),
        Refused(1, "crypt: key", "key is 62 hex digits; aes-xts-plain64 needs 64, 96 or 128"),
    ),
    (crypt(K64 + "0"), Refused(1, "crypt: key", "key is 129 hex digits")),
    (crypt(K16), Refused(1, "crypt: key", "key is 32 hex digits")),
    (
        crypt(K16[:30], cipher="aes-cbc-plain64"),
        Refused(
            1, "crypt: key", "key is 30 hex digits; aes-cbc-plain64 needs 32, 48 or 64 hex digits"
        ),
    ),
    (crypt("zz" + K64[2:]), Refused(1, "crypt: key", "key is not hexadecimal")),
    (
        crypt(":32:logon:my_prefix:my_key"),
        Refused(1, "crypt: key", "kernel keyring keys are not supported"),
    ),
    (crypt(":64:user:desc"), Refused(1, "crypt: key", "give the key in hex")),
    (
        crypt("-"),
        Refused(1, "crypt: key", "key is '-' (none); aes-xts-plain64 needs 64, 96 or 128"),
    ),
    (crypt(K32, cipher="cipher_null-ecb"), Refused(1, "crypt: key", "needs '-' (no key)")),
    (crypt(cipher="serpent-xts-plain64"), Refused(1, "crypt: cipher", "serpent")),
    (crypt(K32, cipher="aes-cbc-essiv"), Refused(1, "crypt: cipher", "")),
    (crypt(cipher="capi:gcm(aes)-random"), Refused(1, "crypt: cipher", "")),
    (
        crypt(rest="0 sda2 0 2 allow_discards"),
        Refused(1, "crypt: feature args", "the count is 2 but 1 follow"),
    ),
    (
        crypt(rest="0 sda2 0 1 allow_discards same_cpu_crypt"),
        Refused(1, "crypt: feature args", "the count is 1 but 2 follow"),
    ),
    (
        crypt(rest="0 sda2 0 allow_discards"),
        Refused(1, "crypt: feature args", "Invalid number of feature args"),
    ),
    (
        crypt(rest="0 sda2 0 9 " + " ".join(["allow_discards"] * 9)),
        Refused(1, "crypt: feature args", "from 0 to 8"),
    ),
    (
        crypt(rest="0 sda2 0 -1"),
        Refused(1, "crypt: feature args", "Invalid number of feature args"),
    ),
    (
        crypt(rest="0 sda2 0 1 discard"),
        Refused(1, "crypt: feature args", 'unknown feature "discard"'),
    ),
    (
        crypt(rest="0 sda2 0 1 integrity:28:aead"),
        Refused(1, "crypt: feature args", "integrity is not supported"),
    ),
    (
        crypt(rest="0 sda2 0 1 high_priority"),
        Refused(1, "crypt: feature args", "high_priority is not supported"),
    ),
    (
        crypt(rest="0 sda2 0 1 sector_size:1000"),
        Refused(1, "crypt: sector_size", "Invalid feature value for sector_size"),
    ),
    (
        crypt(rest="0 sda2 0 1 sector_size:256"),
        Refused(1, "crypt: sector_size", "power of two from 512 to 4096"),
    ),
    (
        crypt(rest="0 sda2 0 1 sector_size:8192"),
        Refused(1, "crypt: sector_size", "Invalid feature value"),
    ),
    (
        crypt(rest="0 sda2 0 1 sector_size:"),
        Refused(1, "crypt: sector_size", "Invalid feature value"),
    ),
    (
        crypt(rest="0 sda2 0 1 sector_size:+4096"),
        Refused(1, "crypt: sector_size", "Invalid feature value"),
    ),
    (
        crypt(rest="0 sda2 0 1 sector_size:4096", length=12),
        Refused(1, "crypt: sector_size", "Device size is not multiple of sector_size feature"),
    ),
    (
        crypt(rest="4 sda2 0 1 sector_size:4096"),
        Refused(1, "crypt: iv_offset", "Invalid iv_offset sector: 4 is not a multiple"),
    ),
    (
        crypt(rest="4 sda2 0 2 sector_size:4096 iv_large_sectors"),
        Refused(1, "crypt: iv_offset", "Invalid iv_offset sector"),
    ),
    (crypt(rest="-1 sda2 0"), Refused(1, "crypt: iv_offset", "Invalid iv_offset sector")),
    (crypt(rest="x sda2 0"), Refused(1, "crypt: iv_offset", "Invalid iv_offset sector")),
    (crypt(rest="0 sda2 x"), Refused(1, "crypt: offset", "Invalid device sector")),
    (
        crypt(rest="0 sda2 18446744073709551616"),
        Refused(1, "crypt: offset", "Invalid device sector"),
    ),
    (crypt(rest="0 /dev/a/b 0"), Refused(1, "crypt: device", "invalid device name")),
    (crypt(rest="0 253:0 0"), Refused(1, "crypt: device", "major:minor")),
    (
        "0 1 zero\n" + crypt(rest="0 sda2 0 1 sector_size:4096").replace("0 8", "1 8", 1),
        Refused(2, "start", "crypt target starts at sector 1, not a multiple of sector_size 4096"),
    ),
    (
        crypt(rest="0 sda2 0 1 sector_size:4096") + "\n8 1 zero",
        Refused(2, "length", "table size 9 sectors is not aligned to the logical block size 4096"),
    ),
    (
        crypt("00" * 1024, cipher="aes:64-cbc-lmk", rest="0 sda2 0 1 sector_size:4096"),
        Refused(1, "crypt: sector_size", "Unsupported sector size for LMK"),
    ),
]
