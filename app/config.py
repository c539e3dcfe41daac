"""Settings from the environment (prefix ``REQCRYPT_``), validated so unsafe setups refuse to start."""

from __future__ import annotations

import ipaddress
import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_data_dir() -> Path:
    """XDG data home, so a user install never writes into the current directory."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "reqcrypt"


def physical_memory() -> int:
    """Bytes of RAM (POSIX sysconf); 2 GiB where the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 2 << 30


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


SplitSize = Annotated[int, Field(ge=4096, le=1 << 30, multiple_of=4096)]
"""dm-crypt's split size in bytes: whole pages, up to 1 GiB."""


class SettingsView(BaseModel):
    """The settings one part of the service reads, taken from ``Settings`` by field name:
    each part gets its own typed view instead of a hand copy of the fields it needs."""

    model_config = ConfigDict(frozen=True, from_attributes=True)


class ControlSettings(SettingsView):
    """What the control plane holds at most (REQCRYPT_MAX_*), checked before anything is
    written, and the queue defaults of the volumes it builds."""

    max_devices: int
    max_volumes: int
    max_device_bytes: int
    max_total_device_bytes: int
    max_table_lines: int
    max_table_line_length: int
    plug_window_us: int
    crypt_max_read_size: int | None
    crypt_max_write_size: int | None
    suspend_wait_seconds: float


class HttpLimits(SettingsView):
    """What the HTTP API bounds: a body's size and the pieces it is read in, the ranges
    and bytes of a batch, how long a request's head and body may take, how long a call
    waits for a suspend, and the I/Os in flight on one volume (REQCRYPT_MAX_VOLUME_IOS,
    which NBD counts against too)."""

    max_body_bytes: int
    io_chunk_bytes: int
    max_ranges: int
    max_batch_bytes: int
    max_control_body_bytes: int
    body_timeout_seconds: float
    body_min_rate_bytes: int
    head_timeout_seconds: float
    suspend_wait_seconds: float
    max_volume_ios: int
    max_connections: int
    send_timeout_seconds: float


class ClusterSettings(SettingsView):
    """This process as one node of a cluster sharing the database (REQCRYPT_NODE_ID)."""

    node_id: str
    advertised_url: str
    lease_seconds: float
    renew_interval: float
    cluster_data_path: Literal["redirect", "proxy"]


class NbdSettings(SettingsView):
    """The NBD listener (REQCRYPT_NBD_*): its port, a connection's bounds on requests in
    flight and, off loopback, mutual TLS."""

    host: str
    nbd_port: int
    nbd_max_in_flight: int
    nbd_max_in_flight_bytes: int
    nbd_max_connections: int
    send_timeout_seconds: float
    nbd_tls_cert: Path | None
    nbd_tls_key: Path | None
    nbd_tls_ca: Path | None


class BenchmarkSettings(SettingsView):
    """How much benchmarking the service takes on (REQCRYPT_MAX_BENCHMARK_*)."""

    max_benchmark_jobs: int
    max_benchmark_bytes: int


class LuksSettings(SettingsView):
    """LUKS key derivation: the most one may cost (REQCRYPT_LUKS_MAX_PBKDF_*), the most all
    those of one unlock may cost together (REQCRYPT_LUKS_MAX_UNLOCK_WORK), and how many run
    at once."""

    luks_max_pbkdf_memory_kib: int
    luks_max_pbkdf_time: int
    luks_max_pbkdf_parallel: int
    luks_max_pbkdf_iterations: int
    luks_max_unlock_work: int
    luks_pbkdf_workers: int


class Settings(BaseSettings):
    # An empty variable (``REQCRYPT_ADMIN_TOKEN=`` in .env.example) means unset, as in a shell.
    model_config = SettingsConfigDict(env_prefix="REQCRYPT_", extra="ignore", env_ignore_empty=True)

    data_dir: Path = Field(default_factory=default_data_dir)
    database_url: str | None = None
    master_key_file: Path | None = None
    master_key: SecretStr | None = Field(
        default=None, description="64 hex digits; overrides master_key_file"
    )
    admin_token: SecretStr | None = None
    io_token: SecretStr | None = None
    auth: Literal["enabled", "disabled"] = "enabled"
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    migrate_on_start: bool = True
    log_level: str = "info"
    max_body_bytes: int = Field(default=1 << 30, ge=512)
    io_chunk_bytes: int = Field(default=1 << 20, ge=4096, le=64 << 20)
    max_ranges: int = Field(
        default=256, ge=1, le=65536, description="ranges in one GET, parts in one batched PUT"
    )
    max_batch_bytes: int = Field(
        default=64 << 20,
        ge=4096,
        description="bytes of a multi-range GET or a multipart PUT, held in memory at once",
    )
    max_control_body_bytes: int = Field(
        default=8 << 20,
        ge=1024,
        description="JSON body of a control request; larger: 413 before it is read",
    )
    max_device_bytes: int = Field(
        default=16 << 40,
        ge=512,
        le=1 << 50,  # vocab.MAX_DEVICE_BYTES (config is a leaf)
        description="size of one device (16 TiB)",
    )
    max_total_device_bytes: int = Field(
        default=64 << 40, ge=512, description="sizes of all devices together (64 TiB)"
    )
    max_devices: int = Field(default=1024, ge=1, description="registered devices")
    max_volumes: int = Field(default=1024, ge=1, description="volumes")
    max_table_lines: int = Field(default=1024, ge=1, description="target lines in one table")
    max_table_line_length: int = Field(
        default=4096, ge=64, description="characters in one table line"
    )
    max_volume_ios: int = Field(
        default=256,
        ge=1,
        description="I/Os in flight on one volume, HTTP and NBD alike; past it HTTP is "
        "answered 503 with Retry-After and NBD requests wait",
    )
    body_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        description="longest wait for the next piece of a request body; then 408",
    )
    body_min_rate_bytes: int = Field(
        default=64 << 10,
        ge=1,
        description="slowest whole-body rate: a body must arrive within "
        "body_timeout_seconds + its length / this rate, else 408",
    )
    max_benchmark_jobs: int = Field(
        default=4, ge=1, description="benchmark jobs queued or running at once; more: 503"
    )
    max_benchmark_bytes: int = Field(
        default=64 << 30, ge=4096, description="bytes one benchmark job may move over all its cells"
    )
    keep_alive_seconds: int = Field(
        default=5, ge=1, description="an idle keep-alive connection closes after this long"
    )
    head_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="a request's line and headers must arrive within this long of the "
        "connection or of their first byte (else 408; a connection that sent nothing closes)",
    )
    suspend_wait_seconds: float = Field(default=30.0, ge=0)
    max_connections: int = Field(
        default=1024,
        ge=1,
        le=1 << 20,
        description="HTTP connections open at once; past it a new connection is answered "
        "503 and closed, the open ones served as before",
    )
    nbd_max_connections: int = Field(
        default=256,
        ge=1,
        le=1 << 20,
        description="NBD connections open at once; past it a new connection is closed "
        "before negotiation, the open ones served as before",
    )
    max_buffered_bytes: int | None = Field(
        default=None,
        ge=1 << 20,
        description="bytes held for clients at once, HTTP and NBD together (bodies being "
        "received, replies not yet taken); past it new requests wait or get 503; unset: "
        "an eighth of physical memory, between 256 MiB and 4 GiB",
    )
    send_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="longest a client may leave the server's reply unread (HTTP and NBD): "
        "no progress for this long closes the connection",
    )
    metrics_auth: Literal["none", "io"] = Field(
        default="none",
        description="who may read /metrics: anyone (the Prometheus convention), or callers "
        "with the io or admin token",
    )
    plug_window_us: int = Field(default=50, ge=0, le=1_000_000)
    crypt_max_read_size: SplitSize | None = Field(
        default=None,
        description="dm-crypt's max_read_size (Linux 6.11, 128 KiB there): a crypt read's "
        "engine calls carry at most this many bytes, spread over the engine's channels; "
        "unset: the engine's own limit. A volume's crypt_split overrides it",
    )
    crypt_max_write_size: SplitSize | None = Field(
        default=None,
        description="dm-crypt's max_write_size, as crypt_max_read_size for writes",
    )
    nbd_port: int | None = Field(
        default=None, ge=0, le=65535, description="serve exported volumes over NBD; unset: off"
    )
    nbd_max_in_flight: int = Field(
        default=256, ge=1, description="requests one NBD connection may have in flight"
    )
    nbd_max_in_flight_bytes: int = Field(
        default=64 << 20, ge=1, description="payload bytes one NBD connection may have in flight"
    )
    nbd_tls_cert: Path | None = Field(default=None, description="PEM server certificate chain")
    nbd_tls_key: Path | None = Field(default=None, description="PEM private key of nbd_tls_cert")
    nbd_tls_ca: Path | None = Field(
        default=None, description="PEM CA certificates that client certificates must chain to"
    )
    ceph_conf: Path | None = Field(
        default=None, description="ceph.conf of the cluster for rbd devices; unset: no rbd store"
    )
    ceph_client: str | None = Field(
        default=None, description="Ceph client name without 'client.' (librados default: admin)"
    )
    ceph_keyring: Path | None = Field(
        default=None, description="keyring of ceph_client; unset: what ceph.conf says"
    )
    ceph_timeout_seconds: float = Field(
        default=10.0, gt=0, le=300, description="connecting to the cluster, /readyz's ping"
    )
    rbd_image_prefix: str = Field(
        default="reqcrypt-",
        pattern=r"^[A-Za-z0-9._-]{0,32}$",
        description="an rbd device's image is named <prefix><device name>",
    )
    rbd_aio: bool = Field(
        default=True,
        description="librbd aio: a dispatch batch's requests are in flight together; "
        "false: one synchronous librbd call per request",
    )
    bench_ceiling: bool = Field(
        default=False, description="mount the /v1/null ceiling endpoints the benchmarks use"
    )
    node_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="this node's name in a cluster sharing one PostgreSQL; unset: one node, "
        "no leases",
    )
    node_url: str | None = Field(
        default=None,
        description="the URL other nodes redirect and forward to; unset: http://HOST:PORT",
    )
    cluster_data_path: Literal["redirect", "proxy"] = Field(
        default="redirect",
        description="how a node answers the data path of a volume another node owns: "
        "307 to the owner (bytes cross the network once), or stream it through",
    )
    lease_seconds: float = Field(
        default=2.0,
        ge=0.5,
        le=300,
        description="a volume lease lasts this long unless renewed: an owner's death costs "
        "its volumes about this plus a renew interval (docs/operations.md, the trade-off)",
    )
    lease_renew_seconds: float | None = Field(
        default=None,
        gt=0,
        description="renew leases (and scan for expired ones) this often; unset: a quarter "
        "of lease_seconds",
    )
    pacing: float | None = Field(
        default=None,
        gt=0,
        le=1000,
        description="really wait the modelled engine/device time, scaled by this factor",
    )
    luks_max_pbkdf_memory_kib: int = Field(
        default=1 << 20, ge=32, le=4 << 20, description="Argon2 memory a LUKS keyslot may ask"
    )
    luks_max_pbkdf_time: int = Field(
        default=64, ge=4, le=1 << 20, description="Argon2 passes a LUKS keyslot may ask"
    )
    luks_max_pbkdf_parallel: int = Field(
        default=16, ge=1, le=1 << 10, description="Argon2 threads a LUKS keyslot may ask"
    )
    luks_max_pbkdf_iterations: int = Field(
        default=50_000_000, ge=1000, description="PBKDF2 iterations a LUKS keyslot may ask"
    )
    luks_max_unlock_work: int = Field(
        default=200_000_000,
        ge=1000,
        description="key-derivation work one LUKS unlock (open, add-key, kill-slot) may cost: "
        "every keyslot a wrong passphrase would try and the digest checked after each, "
        "counted from the header before any runs (else 422). Unit: one HMAC, i.e. a PBKDF2 "
        "iteration per hash-sized block derived (SHA-512 counts 2); an Argon2 keyslot costs "
        "4 per KiB of memory per pass, whatever its threads. The default, about 45 s of one "
        "core, opens four keyslots of 1 GiB x 11 Argon2 passes or eight LUKS1 keyslots of "
        "10,000,000 PBKDF2-SHA256 iterations",
    )
    luks_pbkdf_workers: int = Field(
        default=1, ge=1, le=64, description="LUKS key derivations run at once (more wait)"
    )

    @field_validator("admin_token", "io_token")
    @classmethod
    def _long_token(cls, token: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if token is not None and len(token.get_secret_value()) < 16:
            unset = (
                "leave it empty to have one generated in the data directory"
                if info.field_name == "admin_token"
                else "leave it empty for no io token"
            )
            raise ValueError(
                "too short: a token needs at least 16 characters (make one with "
                f"`python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`), or {unset}"
            )
        return token

    @field_validator("master_key")
    @classmethod
    def _master_key_256_bits(cls, key: SecretStr | None) -> SecretStr | None:
        if key is not None:
            raw = key.get_secret_value()
            try:
                ok = len(bytes.fromhex(raw)) == 32
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(
                    "not a 256-bit key: it must be 64 hex digits (make one with "
                    "`python3 -c 'import secrets; print(secrets.token_hex(32))'`), "
                    "or leave it empty to have one generated in the data directory"
                )
        return key

    @model_validator(mode="after")
    def _refuse_unsafe(self) -> Settings:
        if self.auth == "disabled" and not is_loopback(self.host):
            raise ValueError(
                f"REQCRYPT_AUTH=disabled is only allowed when bound to a loopback address, not {self.host!r}"
            )
        tls = (self.nbd_tls_cert, self.nbd_tls_key, self.nbd_tls_ca)
        if any(path is not None for path in tls) and not all(path is not None for path in tls):
            raise ValueError(
                "NBD TLS needs all of REQCRYPT_NBD_TLS_CERT, REQCRYPT_NBD_TLS_KEY and REQCRYPT_NBD_TLS_CA"
            )
        if self.nbd_port is not None and not is_loopback(self.host) and self.nbd_tls_ca is None:
            raise ValueError(
                f"REQCRYPT_NBD_PORT on {self.host!r} (not loopback) needs TLS with verified "
                "client certificates: set REQCRYPT_NBD_TLS_CERT, REQCRYPT_NBD_TLS_KEY and REQCRYPT_NBD_TLS_CA"
            )
        if self.node_id is not None and not self.resolved_database_url.startswith("postgresql"):
            raise ValueError(
                "REQCRYPT_NODE_ID (a cluster node) needs a shared PostgreSQL in "
                "REQCRYPT_DATABASE_URL: leases rely on its clock and row locks"
            )
        if self.renew_interval >= self.lease_seconds:
            raise ValueError(
                "REQCRYPT_LEASE_RENEW_SECONDS must be shorter than REQCRYPT_LEASE_SECONDS"
            )
        return self

    @property
    def control(self) -> ControlSettings:
        return ControlSettings.model_validate(self)

    @property
    def benchmarks(self) -> BenchmarkSettings:
        return BenchmarkSettings.model_validate(self)

    @property
    def luks(self) -> LuksSettings:
        return LuksSettings.model_validate(self)

    @property
    def cluster(self) -> ClusterSettings | None:
        """None: one node, no leases."""
        return None if self.node_id is None else ClusterSettings.model_validate(self)

    @property
    def nbd(self) -> NbdSettings | None:
        """None: no NBD listener."""
        return None if self.nbd_port is None else NbdSettings.model_validate(self)

    @property
    def http(self) -> HttpLimits:
        return HttpLimits.model_validate(self)

    @property
    def buffered_bytes(self) -> int:
        """``max_buffered_bytes``, or its default sized to this machine's memory."""
        if self.max_buffered_bytes is not None:
            return self.max_buffered_bytes
        return min(max(physical_memory() // 8, 256 << 20), 4 << 30)

    @property
    def renew_interval(self) -> float:
        return self.lease_renew_seconds or self.lease_seconds / 4

    @property
    def advertised_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return (self.node_url or f"http://{host}:{self.port}").rstrip("/")

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'reqcrypt.db'}"

    @property
    def resolved_master_key_file(self) -> Path:
        return self.master_key_file or self.data_dir / "master.key"

    @property
    def devices_dir(self) -> Path:
        return self.data_dir / "devices"


SECRETS = frozenset({"master_key", "admin_token", "io_token"})


def describe(error: ValidationError) -> list[str]:
    """One line per bad setting: the variable, what is wrong, what would be right.

    Secret values are never echoed.
    """
    lines = []
    for problem in error.errors(include_url=False):
        message = str(problem["msg"]).removeprefix("Value error, ")
        if not problem["loc"]:
            lines.append(message)
            continue
        message = message[:1].lower() + message[1:]
        field = str(problem["loc"][0])
        variable = f"REQCRYPT_{field.upper()}"
        if field in SECRETS or "input" not in problem:
            lines.append(f"{variable}: {message}")
        else:
            lines.append(f"{variable}={problem['input']!s}: {message}")
    return lines


@lru_cache
def get_settings() -> Settings:
    return Settings()
