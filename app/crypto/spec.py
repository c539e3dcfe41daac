"""dm-crypt cipher specifications: parse, validate, print back, size keys.

Pure data: no OpenSSL here, so ``app.dm`` can validate a table line without
touching key material. The grammar and the refusals follow
``drivers/md/dm-crypt.c`` (``crypt_ctr_cipher_old``/``crypt_ctr_cipher_new``,
``crypt_ctr_ivmode``, ``crypt_subkey_size``); where we are stricter than the
kernel the message says so.
"""

from __future__ import annotations

import re
from collections.abc import Sized
from dataclasses import dataclass
from functools import lru_cache

from app.errors import CipherSpecError

__all__ = [
    "AVAILABLE_CIPHERS",
    "BULK_IV_MODES",
    "CHAINMODES",
    "ESSIV_HASHES",
    "IV_MODES",
    "CipherSpec",
    "KeyLayout",
    "parse_cipher_spec",
]

TCW_WHITENING_SIZE = 16
"""Bytes of TrueCrypt whitening seed at the end of a tcw key (kernel ``TCW_WHITENING_SIZE``)."""


@dataclass(frozen=True, slots=True)
class _CipherInfo:
    block_size: int
    key_sizes: tuple[int, ...]


AVAILABLE_CIPHERS: dict[str, _CipherInfo] = {
    "aes": _CipherInfo(16, (16, 24, 32)),
    "camellia": _CipherInfo(16, (16, 24, 32)),
    "sm4": _CipherInfo(16, (16,)),
    "seed": _CipherInfo(16, (16,)),
    "des3_ede": _CipherInfo(8, (24,)),
    "blowfish": _CipherInfo(8, tuple(range(4, 57))),
    "cast5": _CipherInfo(8, tuple(range(5, 17))),
    "cipher_null": _CipherInfo(1, (0,)),
}
"""Linux cipher names that pyca/cryptography also implements, with the kernel's key sizes."""

_LINUX_ONLY_CIPHERS = frozenset(
    {
        "twofish", "serpent", "tnepres", "anubis", "khazad", "tea", "xtea", "xeta",
        "des", "aria", "fcrypt", "arc4", "chacha20", "xchacha20", "xchacha12",
        "adiantum", "sm4_generic", "cast6",
    }
)  # fmt: skip

CHAINMODES = ("ecb", "cbc", "xts", "ctr")
IV_MODES = ("plain", "plain64", "plain64be", "essiv", "benbi", "null", "eboiv", "lmk", "tcw")
BULK_IV_MODES = frozenset(
    {None, "plain", "plain64", "plain64be", "null", "benbi", "essiv", "eboiv"}
)
"""IV modes where one starting sector determines every data unit's IV (no data-dependent IV)."""

ESSIV_HASHES: dict[str, int] = {"sha256": 32, "md5": 16, "sha1": 20, "sha512": 64, "sha384": 48,
                                "sha224": 28, "sha3-256": 32, "sm3": 32}  # fmt: skip
"""Digest sizes; the digest is the salt, so it must be a valid key size of the cipher."""

_AEAD_PREFIXES = ("authenc", "gcm", "rfc4106", "rfc4309", "rfc4543", "ccm", "rfc7539",
                  "chacha20poly1305", "aegis", "morus", "integrity")  # fmt: skip
_LINUX_ONLY_CHAINMODES = frozenset({"lrw", "pcbc", "cts", "ofb", "cfb", "hctr2", "xctr", "essiv"})
_CAPI_RE = re.compile(r"^([a-z0-9_]+)\(([a-z0-9_]+)\)$")
_KEYCOUNT_RE = re.compile(r"^[0-9]+$")


@dataclass(frozen=True, slots=True)
class KeyLayout:
    """How dm-crypt cuts a key of one length: ``keycount`` subkeys, then IV key material.

    ``extra_size`` is the kernel's ``key_extra_size``: the lmk seed (loop-AES v3) or
    the tcw IV seed + whitening, stored after the subkeys.
    """

    subkey_size: int
    extra_size: int


@dataclass(frozen=True, slots=True)
class CipherSpec:
    """One dm-crypt cipher field, validated; ``text`` is what ``dmsetup table`` prints back."""

    cipher: str
    chainmode: str
    ivmode: str | None
    ivopts: str | None
    keycount: int
    capi: bool
    text: str

    def format(self) -> str:
        """The kernel prints ``cc->cipher_string``, i.e. the field exactly as given."""
        return self.text

    def __str__(self) -> str:
        return self.text

    @property
    def block_size(self) -> int:
        """Block size of the cipher (16 for aes); the unit XTS/CBC/ECB work in."""
        return AVAILABLE_CIPHERS[self.cipher].block_size

    @property
    def skcipher_block_size(self) -> int:
        """Block size of the whole skcipher as the kernel reports it: 1 for ctr (a stream mode)."""
        return 1 if self.chainmode == "ctr" else self.block_size

    @property
    def iv_size(self) -> int:
        """Kernel ``cc->iv_size``: 0 for ecb, else the mode's IV size but at least 8."""
        if self.chainmode == "ecb":
            return 0
        return max(self.block_size, 8)

    @property
    def bulk_derivable(self) -> bool:
        """True when one starting sector determines every data unit's IV and key."""
        return self.ivmode in BULK_IV_MODES and self.keycount == 1

    @property
    def cipher_key_sizes(self) -> tuple[int, ...]:
        """Key sizes one tfm accepts (xts takes two cipher keys)."""
        sizes = AVAILABLE_CIPHERS[self.cipher].key_sizes
        if self.chainmode == "xts":
            return tuple(2 * size for size in sizes)
        return sizes

    def key_layout(self, key_size: int) -> KeyLayout:
        """The kernel's split of ``key_size`` bytes (``crypt_ctr_ivmode``, ``crypt_subkey_size``)."""
        extra = 0
        if self.ivmode == "lmk" and key_size % self.keycount:
            extra = key_size // (self.keycount + 1)
        elif self.ivmode == "tcw":
            extra = self.iv_size + TCW_WHITENING_SIZE
        subkey = max(key_size - extra, 0) // self.keycount
        return KeyLayout(subkey_size=subkey, extra_size=extra)

    @property
    def valid_key_sizes(self) -> tuple[int, ...]:
        """Total key bytes accepted, including keycount and lmk/tcw extra key material."""
        return _valid_key_sizes(self)

    def key_sizes(self) -> tuple[int, ...]:
        return self.valid_key_sizes

    def check_key(self, key: Sized) -> None:
        """Refuse a key of the wrong length; the message states lengths only, never bytes."""
        size = len(key)
        if size in self.valid_key_sizes:
            return
        valid = self.valid_key_sizes
        if len(valid) <= 4:
            needs = " or ".join(str(2 * v) for v in valid)
        else:
            needs = f"between {2 * valid[0]} and {2 * valid[-1]}"
        if not valid[0] and len(valid) == 1:
            raise CipherSpecError(f"{self.text} takes no key: give '-'")
        raise CipherSpecError(f"key is {2 * size} hex digits; {self.text} needs {needs}")


@lru_cache(maxsize=256)
def _valid_key_sizes(spec: CipherSpec) -> tuple[int, ...]:
    sizes: set[int] = set()
    extras: list[int | None] = [None]
    if spec.ivmode == "lmk":
        extras = [None, -1]
    for subkey in spec.cipher_key_sizes:
        for extra in extras:
            if spec.ivmode == "tcw":
                total = spec.keycount * subkey + spec.iv_size + TCW_WHITENING_SIZE
            elif extra == -1:
                total = (spec.keycount + 1) * subkey
            else:
                total = spec.keycount * subkey
            layout = spec.key_layout(total)
            exact = layout.subkey_size * spec.keycount + layout.extra_size == total
            if exact and layout.subkey_size == subkey:
                if layout.extra_size and spec.ivmode == "lmk" and layout.extra_size != subkey:
                    continue
                sizes.add(total)
    return tuple(sorted(sizes))


def parse_cipher_spec(text: str) -> CipherSpec:
    """Parse dm-crypt's cipher field: ``cipher[:keycount]-chainmode-ivmode[:ivopts]`` or ``capi:``."""
    if not text or any(ch.isspace() for ch in text):
        raise CipherSpecError("cipher specification is empty or contains whitespace")
    spec = _parse_capi(text) if text.startswith("capi:") else _parse_legacy(text)
    _validate(spec)
    return spec


def _parse_legacy(text: str) -> CipherSpec:
    if "(" in text or ")" in text:
        raise CipherSpecError("bad cipher specification: crypto API names need the 'capi:' prefix")
    head, _, rest = text.partition("-")
    cipher, colon, keycount_text = head.partition(":")
    keycount = 1
    if colon:
        if not _KEYCOUNT_RE.match(keycount_text):
            raise CipherSpecError(f"bad cipher key count specification '{keycount_text}'")
        keycount = int(keycount_text)
        if keycount < 1 or keycount & (keycount - 1):
            raise CipherSpecError(f"bad cipher key count {keycount}: must be a power of two")
    chainmode: str | None
    ivmode: str | None
    ivopts: str | None
    if rest:
        chainmode, dash, tail = rest.partition("-")
        if dash:
            ivmode, colon, opts = tail.partition(":")
            ivopts = opts if colon else None
        else:
            ivmode, ivopts = None, None
    else:
        chainmode, ivmode, ivopts = None, None, None
    # Compatibility with the original mapping format: bare 'aes' (or 'aes-plain') is cbc-plain.
    if chainmode is None or (chainmode == "plain" and ivmode is None):
        chainmode, ivmode = "cbc", "plain"
    return CipherSpec(cipher, chainmode, ivmode, ivopts, keycount, False, text)


def _parse_capi(text: str) -> CipherSpec:
    rest = text[len("capi:") :]
    ivopts: str | None = None
    ivmode: str | None = None
    if ":" in rest:
        rest, _, ivopts = rest.rpartition(":")
    if "-" in rest:
        rest, _, ivmode = rest.rpartition("-")
    api = rest
    if api.startswith(_AEAD_PREFIXES):
        raise CipherSpecError("integrity/AEAD modes need dm-integrity and are not supported")
    if api.startswith("essiv("):
        raise CipherSpecError(
            "crypto API essiv(...) specs are not supported: write capi:cbc(aes)-essiv:sha256"
        )
    match = _CAPI_RE.match(api)
    if match is None:
        raise CipherSpecError(f"unsupported crypto API cipher '{api}': expected mode(cipher)")
    chainmode, cipher = match.group(1), match.group(2)
    keycount = 64 if ivmode == "lmk" else 1
    return CipherSpec(cipher, chainmode, ivmode, ivopts, keycount, True, text)


def _validate(spec: CipherSpec) -> None:
    chainmode, ivmode = spec.chainmode, spec.ivmode
    if chainmode in _AEAD_PREFIXES or ivmode == "random":
        if ivmode == "random":
            raise CipherSpecError(
                "IV mode random is not supported: ciphertext would not be reproducible"
            )
        raise CipherSpecError("integrity/AEAD modes need dm-integrity and are not supported")
    if spec.cipher not in AVAILABLE_CIPHERS:
        if spec.cipher in _LINUX_ONLY_CIPHERS:
            raise CipherSpecError(
                f"cipher '{spec.cipher}' is not available: pyca/cryptography does not implement "
                f"it; available: {', '.join(sorted(AVAILABLE_CIPHERS))}"
            )
        raise CipherSpecError(f"unknown cipher '{spec.cipher}'")
    if chainmode not in CHAINMODES:
        if chainmode in _LINUX_ONLY_CHAINMODES:
            raise CipherSpecError(f"chain mode '{chainmode}' is not supported")
        raise CipherSpecError(f"unknown chain mode '{chainmode}'")
    if ivmode is not None and ivmode not in IV_MODES:
        if ivmode == "elephant":
            raise CipherSpecError("IV mode elephant (BitLocker diffuser) is not supported")
        raise CipherSpecError(f"unknown IV mode '{ivmode}'")
    if chainmode == "ecb":
        if ivmode is not None:
            raise CipherSpecError("ecb takes no IV mode")
    elif ivmode is None:
        raise CipherSpecError(f"chain mode {chainmode} needs an IV mode")
    if spec.cipher == "cipher_null" and chainmode != "ecb":
        raise CipherSpecError("cipher_null is supported only as cipher_null-ecb")
    block = spec.block_size
    if chainmode in ("xts", "ctr") and block != 16:
        raise CipherSpecError(
            f"{chainmode} needs a 16-byte block cipher; {spec.cipher} has {block}"
        )
    if ivmode == "essiv":
        _validate_essiv(spec)
    elif spec.ivopts is not None:
        raise CipherSpecError(f"IV mode {ivmode} takes no options")
    if ivmode in ("lmk", "tcw") and (chainmode != "cbc" or block != 16):
        raise CipherSpecError(f"IV mode {ivmode} is supported only with cbc and a 16-byte block")
    if ivmode == "eboiv" and chainmode != "cbc":
        raise CipherSpecError("IV mode eboiv is supported only with cbc")
    if not spec.valid_key_sizes:
        raise CipherSpecError(f"{spec.text} accepts no key size")


def _validate_essiv(spec: CipherSpec) -> None:
    if not spec.ivopts:
        raise CipherSpecError("digest algorithm missing for ESSIV mode")
    digest = ESSIV_HASHES.get(spec.ivopts)
    if digest is None:
        raise CipherSpecError(
            f"unknown ESSIV hash '{spec.ivopts}'; available: {', '.join(ESSIV_HASHES)}"
        )
    if digest not in AVAILABLE_CIPHERS[spec.cipher].key_sizes:
        raise CipherSpecError(
            f"ESSIV hash {spec.ivopts} gives a {digest}-byte salt, "
            f"not a valid {spec.cipher} key size"
        )
