"""Pydantic v2 request/response models of the control plane (never tables, never payloads)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from app.api.luks_schemas import LuksOpenIn
from app.blk.limits import DEFAULT_NR_REQUESTS, MAX_NR_REQUESTS, QueueLimits
from app.blk.tuning import Tuning, TuningPatch
from app.integers import JsonInt, integral_float
from app.vocab import (
    MAX_DEVICE_BYTES,
    MODEL_NAME_PATTERN,
    NAME_PATTERN,
    TABLE_PATTERN,
    DispatchMode,
    ElevatorName,
    StoreKind,
    VolumeState,
)

MESSAGE_PATTERN = r"^\s*[Kk][Ee][Yy]\s+([Ww][Ii][Pp][Ee]|[Ss][Ee][Tt]\s+\S+)\s*$"
"""What a target message may say: crypt's ``key wipe`` and ``key set <key>`` words."""


PlugWindowUs = Annotated[int, Field(ge=0, le=1_000_000), BeforeValidator(integral_float)]
"""Microseconds (a nullable field: bounds on the int, see ``app.integers``)."""


class Problem(BaseModel):
    """RFC 9457 problem details."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    instance: str | None = None


class DeviceCreate(BaseModel):
    # A pool names an RBD pool, so it needs "store": "rbd" (the if/then below; 422 otherwise).
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "if": {"properties": {"pool": {"type": "string"}}, "required": ["pool"]},
            "then": {"properties": {"store": {"const": "rbd"}}, "required": ["store"]},
        },
    )

    name: str = Field(pattern=NAME_PATTERN, examples=["sda2"])
    size_bytes: JsonInt = Field(
        gt=0,
        le=MAX_DEVICE_BYTES,
        multiple_of=512,
        examples=[64 << 20],
        description="a multiple of 512; at most REQCRYPT_MAX_DEVICE_BYTES (the document "
        "served by a running service states its value)",
    )
    model: str | None = Field(default=None, description="device timing model, e.g. sdcard-bbb")
    store: StoreKind = Field(
        default="file",
        description="file: a sparse file in the data directory; rbd: an RBD image "
        "(needs REQCRYPT_CEPH_CONF, else 422)",
    )
    pool: str | None = Field(
        default=None,
        pattern=NAME_PATTERN,
        description='Ceph pool of the RBD image; only with "store": "rbd" (default "rbd"); '
        "a pool that does not exist: 422",
    )

    @model_validator(mode="after")
    def _pool_needs_rbd(self) -> DeviceCreate:
        if self.pool is not None and self.store != "rbd":
            raise ValueError('pool applies only to "store": "rbd"')
        return self


class DeviceOut(BaseModel):
    name: str
    size_bytes: int
    allocated_bytes: int
    model: str | None
    store: StoreKind
    pool: str | None = Field(description="Ceph pool (rbd devices)")
    image: str | None = Field(description="RBD image name (rbd devices)")
    mapped_by: list[str]


class QueueLimitsIn(BaseModel):
    """Queue limits with the kernel's defaults (sysfs names)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    max_sectors_kb: JsonInt = Field(default=1280, ge=1, le=65536)
    max_segments: JsonInt = Field(default=128, ge=1, le=65535)
    max_segment_size: JsonInt = Field(default=65536, ge=4096, le=1 << 31)
    logical_block_size: Annotated[
        Literal[512, 1024, 2048, 4096], BeforeValidator(integral_float)
    ] = 512
    # An int from 0 to 2, not Literal[0, 1, 2]: a Literal takes false and true (0 == False).
    nomerges: JsonInt = Field(default=0, ge=0, le=2)
    nr_requests: JsonInt = Field(
        default=DEFAULT_NR_REQUESTS,
        ge=1,
        le=MAX_NR_REQUESTS,
        description="requests the scheduler holds waiting for a device tag (sysfs nr_requests)",
    )

    def limits(self) -> QueueLimits:
        return QueueLimits(**self.model_dump())


SplitSize = Annotated[
    int,
    Field(strict=True, ge=4096, le=1 << 30, multiple_of=4096),
    BeforeValidator(integral_float),
]


class CryptSplitIn(BaseModel):
    """dm-crypt's split (Linux 6.11's max_read_size / max_write_size, 128 KiB there): an
    engine call of a crypt read or write carries at most this many bytes, and the
    engine's channels run the pieces side by side. Unset: the service default."""

    model_config = ConfigDict(extra="forbid", strict=True)

    max_read_size: SplitSize | None = None
    max_write_size: SplitSize | None = None


class CryptSplitOut(BaseModel):
    max_read_size: int | None = Field(description="bytes; null: no split below the engine's own")
    max_write_size: int | None = Field(description="bytes; null: no split below the engine's own")


class VolumeCreate(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "oneOf": [
                {"required": ["table"], "properties": {"table": {"type": "string"}}},
                {"required": ["luks"], "properties": {"luks": {"type": "object"}}},
            ]
        },
    )

    name: str = Field(pattern=NAME_PATTERN, examples=["secret"])
    table: str | None = Field(
        default=None,
        min_length=1,
        pattern=TABLE_PATTERN,
        description="dmsetup table text; devices by name, /dev/name or /dev/mapper/volume",
        examples=[
            "0 2048 crypt aes-xts-plain64 "
            "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f 0 sda2 0"
        ],
    )
    dispatch_mode: DispatchMode = "request"
    engine: str = Field(default="software", pattern=MODEL_NAME_PATTERN)
    elevator: ElevatorName = "none"
    queue_limits: QueueLimitsIn | None = None
    plug_window_us: PlugWindowUs | None = Field(
        default=None, description="request mode's plug window; default: service setting"
    )
    crypt_split: CryptSplitIn | None = None
    nbd_export: bool = Field(default=False, description="serve over NBD under the volume's name")
    luks: LuksOpenIn | None = Field(
        default=None,
        description="luksOpen instead of a table: the crypt table cryptsetup maps is derived "
        "from the device's LUKS header and the passphrase (which is never stored)",
    )

    @model_validator(mode="after")
    def _table_or_luks(self) -> VolumeCreate:
        if (self.table is None) == (self.luks is None):
            raise ValueError("give exactly one of table and luks")
        return self

    def tuning(self) -> Tuning:
        split = self.crypt_split or CryptSplitIn()
        return Tuning(
            dispatch_mode=self.dispatch_mode,
            elevator=self.elevator,
            limits=self.queue_limits.limits() if self.queue_limits else QueueLimits(),
            plug_window_us=self.plug_window_us,
            max_read_size=split.max_read_size,
            max_write_size=split.max_write_size,
        )


class VolumePatch(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    dispatch_mode: DispatchMode | None = None
    engine: Annotated[str, Field(pattern=MODEL_NAME_PATTERN)] | None = None
    elevator: ElevatorName | None = None
    queue_limits: QueueLimitsIn | None = None
    plug_window_us: PlugWindowUs | None = None
    crypt_split: CryptSplitIn | None = Field(
        default=None, description="a size left out keeps the volume's current one"
    )
    nbd_export: bool | None = None

    def patch(self) -> TuningPatch:
        split = self.crypt_split or CryptSplitIn()
        return TuningPatch(
            dispatch_mode=self.dispatch_mode,
            elevator=self.elevator,
            limits=self.queue_limits.limits() if self.queue_limits else None,
            plug_window_us=self.plug_window_us,
            max_read_size=split.max_read_size,
            max_write_size=split.max_write_size,
        )


class TableIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    table: str = Field(min_length=1, pattern=TABLE_PATTERN)


class SuspendIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    noflush: bool = False


class MessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    message: str = Field(
        pattern=MESSAGE_PATTERN,
        examples=["key wipe"],
        description="crypt's messages: 'key wipe' and 'key set <hex>' (case-insensitive)",
    )
    sector: JsonInt = Field(default=0, ge=0, description="selects the target, as dmsetup message")


class RenameIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    new_name: str = Field(pattern=NAME_PATTERN)


class MoveIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    node: str = Field(min_length=1, max_length=64, description="the live node to serve it")


class OwnerOut(BaseModel):
    """Which cluster node serves the volume and its lease (absent on a single node)."""

    node: str
    url: str
    lease_epoch: int = Field(description="incremented at every takeover")
    lease_expires_at: datetime = Field(description="the database's clock")
    lease_remaining_seconds: float = Field(
        description="until this node stops serving it unless renewed (its own clock)"
    )


class TargetOut(BaseModel):
    start: int
    length: int
    target_type: str
    params: str = Field(description="arguments as dmsetup table prints them, keys zeroed")


class NbdConnectionOut(BaseModel):
    peer: str
    tls: bool
    structured_replies: bool
    in_flight: int
    connected_at: datetime


class VolumeOut(BaseModel):
    name: str
    uuid: str
    state: VolumeState
    size_sectors: int
    size_bytes: int
    open_count: int
    event_nr: int
    tables: list[Literal["LIVE", "INACTIVE"]]
    targets: list[TargetOut]
    dispatch_mode: DispatchMode
    engine: str
    elevator: ElevatorName
    queue_limits: QueueLimitsIn
    plug_window_us: int
    crypt_split: CryptSplitOut
    queue_depth: int = Field(description="hardware tags, from the device model (sdcard-bbb: 1)")
    logical_block_size: int
    nbd_export: bool
    nbd_connections: list[NbdConnectionOut] = Field(
        default_factory=list, description="open NBD connections to this volume"
    )
    owner: OwnerOut | None = Field(default=None, description="a cluster node's lease on it")
    suspend_wait_seconds: float = Field(
        description="how long I/O to it waits for a resume while it is suspended, then 503"
    )


class RangeIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    offset: JsonInt = Field(ge=0, description="bytes, any alignment")
    length: JsonInt = Field(ge=0, description="bytes, any alignment")
