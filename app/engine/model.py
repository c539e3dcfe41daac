"""What an engine can do and what it costs: capabilities, cost model, device model.

Pure data: frozen slotted dataclasses declared once, field constraints in
their annotations. pydantic reads those declarations for every other view:
``validate()``/``from_dict()`` (raising ``InvalidInput`` with a message a
user can act on), ``to_dict()`` for the JSON column custom models persist in,
and the API's request and response schemas, which are these classes. Rules
between fields live in ``_check``. Nothing here knows about keys or bytes; the
cipher spec is seen only through ``SpecLike``, so a workload can be modelled
without a key and without ``app.crypto``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Protocol, Self, TypeAlias

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    PlainSerializer,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
)

from app.errors import InvalidInput
from app.integers import integral_float
from app.vocab import (
    DATA_UNIT_SIZES,
    DEFAULT_QUEUE_DEPTH,
    MAX_QUEUE_DEPTH,
    MODEL_NAME_PATTERN,
    SECTOR_SIZE,
    CipherOp,
)

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


def _unit_sizes(sizes: frozenset[int]) -> frozenset[int]:
    if not sizes <= DATA_UNIT_SIZES:
        raise ValueError(f"must be a subset of 512, 1024, 2048, 4096, got {sorted(sizes)}")
    return sizes


def _distinct(items: Any) -> Any:
    """A JSON array for a set must not repeat an item: the schema says uniqueItems."""
    if isinstance(items, list):
        try:
            distinct = len(set(items))  # 512 and 512.0 are one item, as in JSON Schema
        except TypeError:
            return items  # not a list of names or sizes: the type check refuses it
        if distinct != len(items):
            raise ValueError("items must be unique")
    return items


ModelName = Annotated[str, Field(strict=True, pattern=MODEL_NAME_PATTERN)]
Description = Annotated[str, Field(strict=True, max_length=1000)]
Nanoseconds = Annotated[float, Field(strict=True, ge=0, le=_MAX_LATENCY_NS, allow_inf_nan=False)]
BytesPerSecond = Annotated[float, Field(strict=True, gt=0, le=MAX_RATE, allow_inf_nan=False)]
Names = Annotated[
    frozenset[ModelName],
    Field(min_length=1),
    BeforeValidator(_distinct),
    PlainSerializer(sorted, return_type=list[str]),
]
UnitSizes = Annotated[
    frozenset[
        Annotated[
            int,
            Field(strict=True, json_schema_extra={"enum": sorted(DATA_UNIT_SIZES)}),
            BeforeValidator(integral_float),
        ]
    ],
    Field(min_length=1),
    BeforeValidator(_distinct),
    AfterValidator(_unit_sizes),
    PlainSerializer(sorted, return_type=list[int]),
]


_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def _adapter(cls: type[Any]) -> TypeAdapter[Any]:
    """Built on first use: the classes must be complete before pydantic reads them."""
    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        adapter = _ADAPTERS[cls] = TypeAdapter(cls)
    return adapter


def _invalid(kind: str, exc: ValidationError) -> InvalidInput:
    """Locations and messages only, as the API renders its own validation errors."""
    issues = "; ".join(
        f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}" for error in exc.errors()
    )
    return InvalidInput(f"{kind}: {issues}")


class _Schema:
    """One declaration, every view: pydantic validates and (de)serialises the dataclass itself."""

    __slots__ = ()
    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(
        extra="forbid", revalidate_instances="always"
    )
    _kind: ClassVar[str]

    def validate(self) -> None:
        try:
            _adapter(type(self)).validate_python(self)
        except ValidationError as exc:
            raise _invalid(self._kind, exc) from None
        self._check()

    def _check(self) -> None:
        """Rules between fields, beyond what each field's type says."""

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = _adapter(type(self)).dump_python(self, mode="json")
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        try:
            value: Self = _adapter(cls).validate_python(data)
        except ValidationError as exc:
            raise _invalid(cls._kind, exc) from None
        value._check()
        return value


@dataclass(frozen=True, slots=True)
class Capabilities(_Schema):
    """``CRYPTO_ALG_BULK`` made precise: what one engine call may cover.

    ``bulk_ivmodes`` are the IV modes the engine derives per data unit from one
    starting IV; an empty set is a classic engine (one call per data unit).
    ``keyed_iv`` says the engine holds the ESSIV salt / EBOIV key, the only way
    it can derive those. ``ciphers``/``chainmodes`` of ``None`` mean "any the
    crypto layer has" (the software engine).
    """

    _kind: ClassVar[str] = "capabilities"
    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(
        extra="forbid",
        revalidate_instances="always",
        # The rule ``_check`` enforces, stated for clients: a keyed IV mode needs keyed_iv.
        json_schema_extra={
            "if": {
                "properties": {
                    "bulk_ivmodes": {"contains": {"enum": list[JsonValue](sorted(KEYED_IV_MODES))}}
                },
                "required": ["bulk_ivmodes"],
            },
            "then": {"properties": {"keyed_iv": {"const": True}}, "required": ["keyed_iv"]},
        },
    )

    ciphers: Annotated[Names | None, Field(description="null: every cipher")] = frozenset({"aes"})
    chainmodes: Annotated[Names | None, Field(description="null: every chain mode")] = frozenset(
        {"cbc", "ecb"}
    )
    bulk_ivmodes: Annotated[
        frozenset[
            Annotated[ModelName, Field(json_schema_extra={"enum": sorted(DERIVABLE_IV_MODES)})]
        ],
        BeforeValidator(_distinct),
        PlainSerializer(sorted, return_type=list[str]),
        Field(description="IV modes derived per data unit from one IV"),
    ] = frozenset()
    keyed_iv: Annotated[
        bool, Field(strict=True, description="holds the ESSIV salt / EBOIV key")
    ] = False
    data_unit_sizes: UnitSizes = DATA_UNIT_SIZES
    max_bytes_per_call: Annotated[
        int,
        Field(
            strict=True, ge=MIN_BYTES_PER_CALL, le=MAX_BYTES_PER_CALL_LIMIT, multiple_of=SECTOR_SIZE
        ),
        BeforeValidator(integral_float),
    ] = 1 << 20
    max_segments_per_call: Annotated[
        int, Field(strict=True, ge=1, le=MAX_SEGMENTS_LIMIT), BeforeValidator(integral_float)
    ] = 256
    channels: Annotated[
        int,
        Field(strict=True, ge=1, le=MAX_CHANNELS, description="calls run in parallel"),
        BeforeValidator(integral_float),
    ] = 1

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

    def capped(self, max_bytes: int | None) -> Capabilities:
        """These capabilities with calls of at most ``max_bytes`` (dm-crypt's split), never
        above the engine's own limit; ``None``: unchanged."""
        if max_bytes is None or max_bytes >= self.max_bytes_per_call:
            return self
        return _capped(self, max_bytes)

    def derives_iv(self, spec: SpecLike) -> bool:
        return self.fallback_reason(spec) is None

    def _check(self) -> None:
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
        if min(self.data_unit_sizes) > self.max_bytes_per_call:
            raise InvalidInput("max_bytes_per_call is smaller than every supported data unit size")


@functools.lru_cache(maxsize=64)
def _capped(capabilities: Capabilities, max_bytes: int) -> Capabilities:
    """Built once per (engine, split): the data path asks per request."""
    return dataclasses.replace(capabilities, max_bytes_per_call=max_bytes)


@dataclass(frozen=True, slots=True)
class CostModel(_Schema):
    """Time of one engine call: ``setup + segments * segment + bytes / throughput``.

    The per-call setup is what made hardware engines lose to the CPU at 512 B
    units; the per-segment term is the DMA descriptor per scatterlist entry.
    """

    _kind: ClassVar[str] = "cost"

    setup_ns: Annotated[Nanoseconds, Field(description="fixed cost of one engine call")]
    encrypt_bytes_per_s: BytesPerSecond
    decrypt_bytes_per_s: BytesPerSecond
    segment_ns: Annotated[Nanoseconds, Field(description="per scatterlist entry")] = 0.0

    @classmethod
    def symmetric(cls, setup_ns: float, bytes_per_s: float, segment_ns: float = 0.0) -> Self:
        """One throughput both ways: a block cipher engine encrypts and decrypts alike."""
        return cls(
            setup_ns=setup_ns,
            encrypt_bytes_per_s=bytes_per_s,
            decrypt_bytes_per_s=bytes_per_s,
            segment_ns=segment_ns,
        )

    def call_ns(self, op: CipherOp, nbytes: int, nr_segments: int = 1) -> float:
        rate = self.encrypt_bytes_per_s if op == "encrypt" else self.decrypt_bytes_per_s
        return self.setup_ns + nr_segments * self.segment_ns + nbytes * 1e9 / rate


@dataclass(frozen=True, slots=True)
class EngineProfile(_Schema):
    """One engine: capabilities, cost of a call, and CPU cost of software IVs.

    ``cpu_iv_ns`` is charged per data unit whose IV the CPU computes (every
    per-unit call); bulk calls derive IVs on the engine and pay none.
    ``queue_hop_ns`` prices each hand-off between threads the crypt target's flags
    leave on its path (``app.engine.kcryptd``), once per dispatched bio or request.
    ``measured`` engines (``software``) run every planned call for real and
    account the wall time they took; their ``cost`` serves predictions only.
    """

    _kind: ClassVar[str] = "engine"

    name: ModelName
    capabilities: Capabilities
    cost: CostModel
    description: Description = ""
    cpu_iv_ns: Annotated[
        Nanoseconds, Field(description="software IV cost per data unit on the fallback path")
    ] = 0.0
    queue_hop_ns: Annotated[
        Nanoseconds,
        Field(
            description="dm-crypt's cost per queue hop (kcryptd, dmcrypt_write, the "
            "submitter's wake) on the machine modelled; 0: the queues are not modelled"
        ),
    ] = 0.0
    measured: Annotated[
        bool,
        Field(strict=True, description="calls really made and timed (software only)"),
        # A request may only say false: custom engines are modelled (EngineRegistry.add_profile).
        WithJsonSchema(
            {
                "type": "boolean",
                "const": False,
                "default": False,
                "description": "custom "
                "engines are modelled: false (only the software preset is measured)",
            },
            mode="validation",
        ),
    ] = False

    def _check(self) -> None:
        self.capabilities._check()


@dataclass(frozen=True, slots=True)
class DeviceModel(_Schema):
    """Backing-device timing: ``latency + bytes / bandwidth`` per I/O, one I/O at a time.

    The per-I/O latency is what makes a 512 KiB write faster per byte than a
    64 KiB one (the SD card figures need it). A bandwidth of ``None`` is
    unlimited: with zero latencies that is the ``none`` model of a plain file.
    ``queue_depth`` is the device's tags: how many requests a volume on it may
    have on the device at once; the others wait in its elevator, and merge.

    A write buffer (an SD card's or SSD's SLC cache): a stream of writes from an
    idle device takes its first ``write_buffer_bytes`` at ``write_bytes_per_s``
    (the burst rate), the rest at ``write_sustained_bytes_per_s``; idle time drains
    the buffer at the sustained rate. Without one every write runs at the burst rate.

    Flash writes smaller than a page cost more than their bytes (the card reads, merges
    and reprograms the page): ``small_write_ns`` is added to each write under
    ``small_write_bytes``, whatever the regime.
    """

    _kind: ClassVar[str] = "device model"

    name: ModelName
    description: Description = ""
    read_latency_ns: Nanoseconds = 0.0
    read_bytes_per_s: Annotated[BytesPerSecond | None, Field(description="null: unlimited")] = None
    write_latency_ns: Nanoseconds = 0.0
    write_bytes_per_s: Annotated[BytesPerSecond | None, Field(description="null: unlimited")] = None
    write_buffer_bytes: Annotated[
        int | None,
        Field(
            strict=True,
            ge=SECTOR_SIZE,
            le=1 << 50,
            description="bytes taken at the burst rate from idle; null: no write buffer",
        ),
        BeforeValidator(integral_float),
    ] = None
    write_sustained_bytes_per_s: Annotated[
        BytesPerSecond | None,
        Field(description="write rate once the buffer is full (its drain rate)"),
    ] = None
    small_write_bytes: Annotated[
        int | None,
        Field(
            strict=True,
            ge=SECTOR_SIZE,
            le=1 << 30,
            multiple_of=SECTOR_SIZE,
            description="a write smaller than this pays small_write_ns (a flash page's "
            "read-modify-write); null: none",
        ),
        BeforeValidator(integral_float),
    ] = None
    small_write_ns: Annotated[
        Nanoseconds, Field(description="extra time of a write under small_write_bytes")
    ] = 0.0
    flush_ns: Nanoseconds = 0.0
    queue_depth: Annotated[
        int,
        Field(
            strict=True,
            ge=1,
            le=MAX_QUEUE_DEPTH,
            description="hardware tags (mmc 1, SATA NCQ 32, NVMe up to 1023)",
        ),
        BeforeValidator(integral_float),
    ] = DEFAULT_QUEUE_DEPTH

    def _check(self) -> None:
        buffered = self.write_buffer_bytes is not None
        if buffered != (self.write_sustained_bytes_per_s is not None):
            raise InvalidInput(
                "device model: write_buffer_bytes and write_sustained_bytes_per_s go together"
            )
        if self.small_write_ns > 0 and self.small_write_bytes is None:
            raise InvalidInput("device model: small_write_ns needs small_write_bytes")
        burst, sustained = self.write_bytes_per_s, self.write_sustained_bytes_per_s
        if burst is not None and sustained is not None and sustained > burst:
            raise InvalidInput(
                "device model: write_sustained_bytes_per_s exceeds write_bytes_per_s (the burst)"
            )

    @property
    def buffered(self) -> bool:
        return self.write_buffer_bytes is not None

    def write_ns(self, nbytes: int, burst_bytes: float) -> float:
        """One write of ``nbytes`` of which ``burst_bytes`` still fit in the buffer."""
        burst = min(nbytes, burst_bytes) if self.buffered else nbytes
        rate, sustained = self.write_bytes_per_s, self.write_sustained_bytes_per_s
        ns = self.write_latency_ns + self.small_write_penalty_ns(nbytes)
        ns += 0.0 if rate is None else burst * 1e9 / rate
        if nbytes > burst and sustained is not None:
            ns += (nbytes - burst) * 1e9 / sustained
        return ns

    def small_write_penalty_ns(self, nbytes: int) -> float:
        """What a write of ``nbytes`` pays beyond latency and bytes: the page's merge."""
        limit = self.small_write_bytes
        return self.small_write_ns if limit is not None and nbytes < limit else 0.0

    def stream_burst_share(self, total_bytes: int) -> float:
        """Share of a back-to-back write stream from idle that runs at the burst rate."""
        if self.write_buffer_bytes is None or total_bytes <= 0:
            return 1.0
        return min(1.0, self.write_buffer_bytes / total_bytes)

    @property
    def instant(self) -> bool:
        return (
            self.read_latency_ns == 0
            and self.write_latency_ns == 0
            and self.flush_ns == 0
            and self.read_bytes_per_s is None
            and self.write_bytes_per_s is None
            and self.write_sustained_bytes_per_s is None
            and self.small_write_ns == 0
        )

    def io_ns(self, op: DeviceOp, nbytes: int) -> float:
        if op == "flush":
            return self.flush_ns
        if op == "read":
            latency, rate = self.read_latency_ns, self.read_bytes_per_s
        else:
            latency = self.write_latency_ns + self.small_write_penalty_ns(nbytes)
            rate = self.write_bytes_per_s
        return latency + (0.0 if rate is None else nbytes * 1e9 / rate)
