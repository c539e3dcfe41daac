"""What an engine can do and what it costs: capabilities, cost model, device model.

Pure data: frozen slotted dataclasses with ``validate()`` (raising
``InvalidInput`` with a message a user can act on) and ``to_dict``/``from_dict``
for the JSON column the lead persists custom models in. Nothing here knows
about keys or bytes; the cipher spec is seen only through ``SpecLike``, so a
workload can be modelled without a key and without ``app.crypto``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeAlias

from app.errors import InvalidInput
from app.vocab import DATA_UNIT_SIZES, SECTOR_SIZE, CipherOp, is_valid_model_name

__all__ = [
    "DERIVABLE_IV_MODES",
    "KEYED_IV_MODES",
    "MAX_BYTES_PER_CALL_LIMIT",
    "MAX_CHANNELS",
    "MAX_RATE",
    "MAX_SEGMENTS_LIMIT",
    "MIN_BYTES_PER_CALL",
    "NEVER_BULK_IV_MODES",
    "UNKEYED_IV_MODES",
    "Capabilities",
    "CostModel",
    "DeviceModel",
    "DeviceOp",
    "EngineProfile",
    "ModelSpec",
    "SpecLike",
]

DeviceOp: TypeAlias = Literal["read", "write", "flush"]


UNKEYED_IV_MODES = frozenset({"plain", "plain64", "plain64be", "null", "benbi"})
"""IVs an engine computes from the sector number alone: always derivable in bulk."""
KEYED_IV_MODES = frozenset({"essiv", "eboiv"})
"""IVs that are a keyed function of the sector: derivable only if the engine holds the salt/key."""
DERIVABLE_IV_MODES = UNKEYED_IV_MODES | KEYED_IV_MODES
NEVER_BULK_IV_MODES = frozenset({"lmk", "tcw", "elephant", "random"})
"""IVs depending on data, a per-sector secret whitening or randomness: never one IV per call."""

MIN_BYTES_PER_CALL = SECTOR_SIZE
MAX_BYTES_PER_CALL_LIMIT = 1 << 30
MAX_SEGMENTS_LIMIT = 1 << 16
MAX_CHANNELS = 1024
MAX_RATE = 1e12  # 1 TB/s: above any real engine or device, catches unit mistakes (bits, KiB)
_MAX_LATENCY_NS = 60e9


class SpecLike(Protocol):
    """The part of ``app.crypto.spec.CipherSpec`` the engine decides on."""

    @property
    def cipher(self) -> str: ...
    @property
    def chainmode(self) -> str: ...
    @property
    def ivmode(self) -> str | None: ...
    @property
    def keycount(self) -> int: ...


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A keyless stand-in for a cipher spec, for modelling workloads (fits, predictions)."""

    cipher: str = "aes"
    chainmode: str = "cbc"
    ivmode: str | None = "plain64"
    keycount: int = 1


def _check_name(kind: str, name: str) -> None:
    if not is_valid_model_name(name):
        raise InvalidInput(
            f"{kind} name {name!r} must be 1-64 characters of a-z, 0-9, '.', '_', '-' "
            "starting with a letter or digit"
        )


def _check_number(label: str, value: float, *, low: float, high: float, strict_low: bool) -> None:
    bad_low = value <= low if strict_low else value < low
    if not math.isfinite(value) or bad_low or value > high:
        bound = "greater than" if strict_low else "at least"
        raise InvalidInput(f"{label} must be {bound} {low:g} and at most {high:g}, got {value!r}")


def _check_int(label: str, value: int, *, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"{label} must be an integer from {low} to {high}, got {value!r}")


def _names(values: frozenset[str] | None) -> list[str] | None:
    return None if values is None else sorted(values)


def _frozen(values: Any) -> frozenset[str] | None:
    return None if values is None else frozenset(str(value) for value in values)


def _field(data: Mapping[str, Any], key: str, kind: str) -> Any:
    try:
        return data[key]
    except KeyError:
        raise InvalidInput(f"{kind}: missing field {key!r}") from None


@dataclass(frozen=True, slots=True)
class Capabilities:
    """``CRYPTO_ALG_BULK`` made precise: what one engine call may cover.

    ``bulk_ivmodes`` are the IV modes the engine derives per data unit from one
    starting IV; an empty set is a classic engine (one call per data unit).
    ``keyed_iv`` says the engine holds the ESSIV salt / EBOIV key, the only way
    it can derive those. ``ciphers``/``chainmodes`` of ``None`` mean "any the
    crypto layer has" (the software engine).
    """

    ciphers: frozenset[str] | None = frozenset({"aes"})
    chainmodes: frozenset[str] | None = frozenset({"cbc", "ecb"})
    bulk_ivmodes: frozenset[str] = frozenset()
    keyed_iv: bool = False
    data_unit_sizes: frozenset[int] = DATA_UNIT_SIZES
    max_bytes_per_call: int = 1 << 20
    max_segments_per_call: int = 256
    channels: int = 1

    @property
    def bulk(self) -> bool:
        """True for a ``CRYPTO_ALG_BULK`` engine (derives at least one IV mode itself)."""
        return bool(self.bulk_ivmodes)

    def unsupported_reason(self, spec: SpecLike, data_unit_size: int) -> str | None:
        """Why the engine cannot run ``spec`` at all (None if it can)."""
        if self.ciphers is not None and spec.cipher not in self.ciphers:
            return f"cipher {spec.cipher} is not supported (has {', '.join(sorted(self.ciphers))})"
        if self.chainmodes is not None and spec.chainmode not in self.chainmodes:
            return (
                f"chain mode {spec.chainmode} is not supported "
                f"(has {', '.join(sorted(self.chainmodes))})"
            )
        if data_unit_size not in self.data_unit_sizes:
            sizes = ", ".join(str(size) for size in sorted(self.data_unit_sizes))
            return f"data unit size {data_unit_size} is not supported (has {sizes})"
        if data_unit_size > self.max_bytes_per_call:
            return f"data unit size {data_unit_size} exceeds max bytes per call"
        return None

    def fallback_reason(self, spec: SpecLike) -> str | None:
        """Why a multi-unit call is impossible for ``spec`` (None: the engine derives the IVs)."""
        if spec.keycount > 1:
            return f"keycount {spec.keycount}: consecutive data units use different keys"
        if not self.bulk:
            return "engine is not bulk-capable"
        ivmode = spec.ivmode
        if ivmode is None:  # ecb: no IV to derive
            return None
        if ivmode in NEVER_BULK_IV_MODES or ivmode not in DERIVABLE_IV_MODES:
            return f"IV mode {ivmode} cannot be derived per data unit"
        if ivmode in KEYED_IV_MODES and not self.keyed_iv:
            return f"IV mode {ivmode} needs the IV key, which the engine does not hold"
        if ivmode not in self.bulk_ivmodes:
            return f"engine does not derive IV mode {ivmode}"
        return None

    def derives_iv(self, spec: SpecLike) -> bool:
        return self.fallback_reason(spec) is None

    def validate(self) -> None:
        for ivmode in sorted(self.bulk_ivmodes):
            if ivmode in NEVER_BULK_IV_MODES or ivmode not in DERIVABLE_IV_MODES:
                raise InvalidInput(
                    f"bulk_ivmodes: {ivmode} cannot be derived by an engine; "
                    f"derivable: {', '.join(sorted(DERIVABLE_IV_MODES))}"
                )
            if ivmode in KEYED_IV_MODES and not self.keyed_iv:
                raise InvalidInput(
                    f"bulk_ivmodes: {ivmode} needs keyed_iv=true (the engine must hold the IV key)"
                )
        if not self.data_unit_sizes or not self.data_unit_sizes <= DATA_UNIT_SIZES:
            raise InvalidInput(
                "data_unit_sizes must be a non-empty subset of 512, 1024, 2048, 4096, "
                f"got {sorted(self.data_unit_sizes)}"
            )
        for label, names in (("ciphers", self.ciphers), ("chainmodes", self.chainmodes)):
            if names is not None and (not names or not all(is_valid_model_name(n) for n in names)):
                raise InvalidInput(f"{label} must be null (any) or a non-empty list of names")
        _check_int(
            "max_bytes_per_call",
            self.max_bytes_per_call,
            low=MIN_BYTES_PER_CALL,
            high=MAX_BYTES_PER_CALL_LIMIT,
        )
        if self.max_bytes_per_call % SECTOR_SIZE:
            raise InvalidInput("max_bytes_per_call must be a multiple of 512")
        if min(self.data_unit_sizes) > self.max_bytes_per_call:
            raise InvalidInput("max_bytes_per_call is smaller than every supported data unit size")
        _check_int(
            "max_segments_per_call", self.max_segments_per_call, low=1, high=MAX_SEGMENTS_LIMIT
        )
        _check_int("channels", self.channels, low=1, high=MAX_CHANNELS)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ciphers": _names(self.ciphers),
            "chainmodes": _names(self.chainmodes),
            "bulk_ivmodes": sorted(self.bulk_ivmodes),
            "keyed_iv": self.keyed_iv,
            "data_unit_sizes": sorted(self.data_unit_sizes),
            "max_bytes_per_call": self.max_bytes_per_call,
            "max_segments_per_call": self.max_segments_per_call,
            "channels": self.channels,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Capabilities:
        kind = "capabilities"
        caps = cls(
            ciphers=_frozen(_field(data, "ciphers", kind)),
            chainmodes=_frozen(_field(data, "chainmodes", kind)),
            bulk_ivmodes=frozenset(_field(data, "bulk_ivmodes", kind)),
            keyed_iv=bool(_field(data, "keyed_iv", kind)),
            data_unit_sizes=frozenset(int(size) for size in _field(data, "data_unit_sizes", kind)),
            max_bytes_per_call=_field(data, "max_bytes_per_call", kind),
            max_segments_per_call=_field(data, "max_segments_per_call", kind),
            channels=_field(data, "channels", kind),
        )
        caps.validate()
        return caps


@dataclass(frozen=True, slots=True)
class CostModel:
    """Time of one engine call: ``setup + segments * segment + bytes / throughput``.

    The per-call setup is what made hardware engines lose to the CPU at 512 B
    units; the per-segment term is the DMA descriptor per scatterlist entry.
    """

    setup_ns: float
    segment_ns: float
    encrypt_bytes_per_s: float
    decrypt_bytes_per_s: float

    def call_ns(self, op: CipherOp, nbytes: int, nr_segments: int = 1) -> float:
        rate = self.encrypt_bytes_per_s if op == "encrypt" else self.decrypt_bytes_per_s
        return self.setup_ns + nr_segments * self.segment_ns + nbytes * 1e9 / rate

    def validate(self) -> None:
        _check_number("setup_ns", self.setup_ns, low=0, high=_MAX_LATENCY_NS, strict_low=False)
        _check_number("segment_ns", self.segment_ns, low=0, high=_MAX_LATENCY_NS, strict_low=False)
        for label, rate in (
            ("encrypt_bytes_per_s", self.encrypt_bytes_per_s),
            ("decrypt_bytes_per_s", self.decrypt_bytes_per_s),
        ):
            _check_number(label, rate, low=0, high=MAX_RATE, strict_low=True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "setup_ns": self.setup_ns,
            "segment_ns": self.segment_ns,
            "encrypt_bytes_per_s": self.encrypt_bytes_per_s,
            "decrypt_bytes_per_s": self.decrypt_bytes_per_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostModel:
        kind = "cost"
        cost = cls(
            setup_ns=float(_field(data, "setup_ns", kind)),
            segment_ns=float(_field(data, "segment_ns", kind)),
            encrypt_bytes_per_s=float(_field(data, "encrypt_bytes_per_s", kind)),
            decrypt_bytes_per_s=float(_field(data, "decrypt_bytes_per_s", kind)),
        )
        cost.validate()
        return cost


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """One engine: capabilities, cost of a call, and CPU cost of software IVs.

    ``cpu_iv_ns`` is charged per data unit whose IV the CPU computes (every
    per-unit call); bulk calls derive IVs on the engine and pay none.
    ``measured`` engines (``software``) run every planned call for real and
    account the wall time they took; their ``cost`` serves predictions only.
    """

    name: str
    capabilities: Capabilities
    cost: CostModel
    description: str = ""
    cpu_iv_ns: float = 0.0
    measured: bool = False

    def validate(self) -> None:
        _check_name("engine", self.name)
        self.capabilities.validate()
        self.cost.validate()
        _check_number("cpu_iv_ns", self.cpu_iv_ns, low=0, high=_MAX_LATENCY_NS, strict_low=False)
        if len(self.description) > 1000:
            raise InvalidInput("description must be at most 1000 characters")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "capabilities": self.capabilities.to_dict(),
            "cost": self.cost.to_dict(),
            "cpu_iv_ns": self.cpu_iv_ns,
            "measured": self.measured,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineProfile:
        kind = "engine"
        profile = cls(
            name=str(_field(data, "name", kind)),
            description=str(data.get("description", "")),
            capabilities=Capabilities.from_dict(_field(data, "capabilities", kind)),
            cost=CostModel.from_dict(_field(data, "cost", kind)),
            cpu_iv_ns=float(data.get("cpu_iv_ns", 0.0)),
            measured=bool(data.get("measured", False)),
        )
        profile.validate()
        return profile


@dataclass(frozen=True, slots=True)
class DeviceModel:
    """Backing-device timing: ``latency + bytes / bandwidth`` per I/O, one I/O at a time.

    The per-I/O latency is what makes a 512 KiB write faster per byte than a
    64 KiB one (the SD card figures need it). A bandwidth of ``None`` is
    unlimited: with zero latencies that is the ``none`` model of a plain file.
    """

    name: str
    description: str = ""
    read_latency_ns: float = 0.0
    read_bytes_per_s: float | None = None
    write_latency_ns: float = 0.0
    write_bytes_per_s: float | None = None
    flush_ns: float = 0.0

    @property
    def instant(self) -> bool:
        return (
            self.read_latency_ns == 0
            and self.write_latency_ns == 0
            and self.flush_ns == 0
            and self.read_bytes_per_s is None
            and self.write_bytes_per_s is None
        )

    def io_ns(self, op: DeviceOp, nbytes: int) -> float:
        if op == "flush":
            return self.flush_ns
        if op == "read":
            latency, rate = self.read_latency_ns, self.read_bytes_per_s
        else:
            latency, rate = self.write_latency_ns, self.write_bytes_per_s
        return latency + (0.0 if rate is None else nbytes * 1e9 / rate)

    def validate(self) -> None:
        _check_name("device model", self.name)
        for label, value in (
            ("read_latency_ns", self.read_latency_ns),
            ("write_latency_ns", self.write_latency_ns),
            ("flush_ns", self.flush_ns),
        ):
            _check_number(label, value, low=0, high=_MAX_LATENCY_NS, strict_low=False)
        for label, rate in (
            ("read_bytes_per_s", self.read_bytes_per_s),
            ("write_bytes_per_s", self.write_bytes_per_s),
        ):
            if rate is not None:
                _check_number(label, rate, low=0, high=MAX_RATE, strict_low=True)
        if len(self.description) > 1000:
            raise InvalidInput("description must be at most 1000 characters")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "read_latency_ns": self.read_latency_ns,
            "read_bytes_per_s": self.read_bytes_per_s,
            "write_latency_ns": self.write_latency_ns,
            "write_bytes_per_s": self.write_bytes_per_s,
            "flush_ns": self.flush_ns,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeviceModel:
        def rate(key: str) -> float | None:
            value = data.get(key)
            return None if value is None else float(value)

        model = cls(
            name=str(_field(data, "name", "device model")),
            description=str(data.get("description", "")),
            read_latency_ns=float(data.get("read_latency_ns", 0.0)),
            read_bytes_per_s=rate("read_bytes_per_s"),
            write_latency_ns=float(data.get("write_latency_ns", 0.0)),
            write_bytes_per_s=rate("write_bytes_per_s"),
            flush_ns=float(data.get("flush_ns", 0.0)),
        )
        model.validate()
        return model
