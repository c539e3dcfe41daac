"""dm-crypt's own queues: the hops a bio takes between the submitter, kcryptd and the device.

The cost model (``cost``) charges a request its cipher and device time. The kernel's
dm-crypt adds hand-offs between threads, which its table flags remove one by one;
this module follows ``drivers/md/dm-crypt.c`` (5.9+, and 6.11 for bio splitting;
docs/engines.md walks the path) and prices each hand-off at one per-hop cost of the
platform being modelled:

- a **hop** is work queued to another thread that must be woken (``queue_work`` on
  ``kcryptd``, ``wake_up_process`` of ``dmcrypt_write``, the Crypto API's ``cryptd``
  for an asynchronous driver called where the SIMD unit is unusable), and the final
  completion waking a submitter that went to sleep because the I/O left its thread;
- the **crypt step** is one Crypto API request per data unit (``unit_ns`` each, plus
  the bytes at the cipher's stated speed); a bio larger than ``max_read_size`` /
  ``max_write_size`` is split (6.11) and the pieces spread over the CPUs an unbound
  ``kcryptd`` may use, while inline and ``same_cpu_crypt`` crypt run on one CPU.

Everything here is at queue depth 1 (the published figures are ``dd``/``fio psync``):
one I/O's time is the sum of its stages. In request mode the hops are paid once per
dispatched request instead of once per bio; at queue depth 1 nothing merges, so the
two modes predict the same, and the published figures cannot tell them apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from app.errors import InvalidInput

__all__ = [
    "BIO_MAX_BYTES",
    "DEFAULT_MAX_SIZE",
    "STOCK",
    "Completion",
    "CryptPath",
    "IoTime",
    "Platform",
    "QueueFlags",
    "crypt_path",
    "io_time",
    "mixed_rate",
]

Op = Literal["read", "write"]
Context = Literal["kcryptd", "kcryptd (bound)", "submitter", "completion"]

BIO_MAX_BYTES = 256 * 4096
"""``BIO_MAX_VECS`` pages: before 6.11 only writes were split, at this size; after, writes stay capped here."""
DEFAULT_MAX_SIZE = 128 * 1024
"""6.11's ``max_read_size`` / ``max_write_size`` module parameters' default."""


@dataclass(frozen=True, slots=True)
class QueueFlags:
    """The crypt target's queue-related table flags and 6.11's split sizes.

    ``max_read_size`` / ``max_write_size`` of ``None`` is a kernel before 6.11: reads
    are never split and writes are split at ``BIO_MAX_BYTES``.
    """

    same_cpu_crypt: bool = False
    submit_from_crypt_cpus: bool = False
    no_read_workqueue: bool = False
    no_write_workqueue: bool = False
    max_read_size: int | None = None
    max_write_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_read_size", "max_write_size"):
            size = getattr(self, name)
            if size is not None and (size < 4096 or size % 4096):
                raise InvalidInput(f"{name} must be a multiple of 4096 bytes, got {size}")

    def split_bytes(self, op: Op) -> int | None:
        """Largest piece ``crypt_map`` lets through (``None``: unsplit)."""
        if op == "read":
            return self.max_read_size
        if self.max_write_size is None:
            return BIO_MAX_BYTES
        return min(self.max_write_size, BIO_MAX_BYTES)


STOCK = QueueFlags()
"""No queue flag: every hop of the path taken."""


@dataclass(frozen=True, slots=True)
class Completion:
    """Where the lower device completes and what kind of cipher driver runs: the facts
    of a platform the path depends on (a live volume's file or RBD store completes in
    its submitter's thread, as ``brd`` does: the defaults)."""

    endio_in_irq: bool = False
    async_driver: bool = False
    kernel: tuple[int, int] = (5, 9)


@dataclass(frozen=True, slots=True)
class Platform:
    """The machine a published figure was taken on, as the queue model sees it.

    ``io_ns`` is one I/O through the raw device (syscall, block layer, the copy:
    read off the source's own raw-device figure), ``device_bytes_per_s`` how that
    grows with the I/O's size. ``hop_ns`` is the fitted cost of one hand-off;
    ``unit_ns`` the Crypto API's cost per data unit beyond its bytes. ``completion``
    says where the lower device completes and what kind of cipher driver runs.
    """

    name: str
    cpus: int | None
    io_ns: dict[Op, float]
    hop_ns: float
    encrypt_bytes_per_s: float | None
    decrypt_bytes_per_s: float | None
    data_unit_size: int = 512
    unit_ns: float = 0.0
    device_bytes_per_s: float | None = None
    completion: Completion = Completion()

    def crypt_ns(self, op: Op, nbytes: int) -> float:
        """One piece's Crypto API work: a request per data unit, then its bytes."""
        rate = self.decrypt_bytes_per_s if op == "read" else self.encrypt_bytes_per_s
        units = math.ceil(nbytes / self.data_unit_size)
        return units * self.unit_ns + (0.0 if rate is None else nbytes * 1e9 / rate)

    def device_ns(self, op: Op, nbytes: int, stated_bytes: int = 4096) -> float:
        """The raw device's time for ``nbytes``, scaled from its figure at ``stated_bytes``."""
        if self.device_bytes_per_s is None:
            return self.io_ns[op]
        return self.io_ns[op] + (nbytes - stated_bytes) * 1e9 / self.device_bytes_per_s


@dataclass(frozen=True, slots=True)
class CryptPath:
    """The kernel's path for one bio: the hops in order, and where the crypt step runs."""

    op: Op
    hops: tuple[str, ...]
    crypt_context: Context

    @property
    def spreads(self) -> bool:
        """Pieces of a split bio can be encrypted on several CPUs at once (unbound kcryptd)."""
        return self.crypt_context == "kcryptd"


def crypt_path(op: Op, flags: QueueFlags, completion: Completion) -> CryptPath:
    """The hops ``crypt_map`` and its completions take for one bio (docs/engines.md)."""
    hops: list[str] = []
    context: Context
    workqueue: Context = "kcryptd (bound)" if flags.same_cpu_crypt else "kcryptd"
    if op == "read":
        # Submitted from crypt_map's caller; decrypted after crypt_endio.
        if flags.no_read_workqueue:
            context = "completion"
            if completion.endio_in_irq and completion.kernel >= (6, 8):
                # 6.8 dropped the tasklet: from hard IRQ the work goes to kcryptd after all.
                hops.append("kcryptd (from hard IRQ)")
                context = "kcryptd"
            elif completion.endio_in_irq and completion.async_driver:
                hops.append("cryptd (SIMD unusable in IRQ)")
        else:
            hops.append(workqueue)
            context = workqueue
    else:
        if flags.no_write_workqueue:
            context = "submitter"  # encrypt in crypt_map, submit directly: no tree, no thread
        else:
            hops.append(workqueue)
            context = workqueue
            # submit_from_crypt_cpus skips the write thread after a synchronous encryption;
            # an asynchronous one completes in kcryptd_async_done, which still queues it.
            if not flags.submit_from_crypt_cpus:
                hops.append("dmcrypt_write")
    if hops and not completion.endio_in_irq:
        # The I/O left the submitter's thread, so it slept in the direct-I/O wait; a
        # device completing in IRQ wakes it anyway, and its raw figure holds that wake.
        hops.append("wake submitter")
    return CryptPath(op, tuple(hops), context)


@dataclass(frozen=True, slots=True)
class IoTime:
    """One I/O at queue depth 1, by stage."""

    device_ns: float
    crypt_ns: float
    hops_ns: float
    pieces: int
    path: CryptPath

    @property
    def total_ns(self) -> float:
        return self.device_ns + self.crypt_ns + self.hops_ns


def io_time(
    platform: Platform,
    flags: QueueFlags,
    op: Op,
    io_bytes: int = 4096,
    *,
    encrypted: bool = True,
    cpus: int | None = None,
) -> IoTime:
    """Modelled time of one ``io_bytes`` bio; ``encrypted=False`` is the raw device.

    A split bio's pieces are queued together, so their hops overlap (one hop's time)
    and their crypt work is list-scheduled over ``cpus`` (the platform's by default)
    when an unbound ``kcryptd`` runs it, else done one after the other.
    """
    path = crypt_path(op, flags, platform.completion)
    device = platform.device_ns(op, io_bytes)
    if not encrypted:
        return IoTime(device, 0.0, 0.0, 0, path)
    split = flags.split_bytes(op) or io_bytes
    sizes = [split] * (io_bytes // split) + ([io_bytes % split] if io_bytes % split else [])
    work = [platform.crypt_ns(op, size) for size in sizes]
    lanes = cpus if cpus is not None else platform.cpus
    if path.spreads and len(work) > 1:
        if lanes is None:
            raise InvalidInput(f"{platform.name}: the CPU count is not stated; pass cpus")
        from app.engine.cost import makespan_ns  # cost prices these paths: imported late

        crypt = makespan_ns(work, lanes)
    else:
        crypt = float(sum(work))
    return IoTime(device, crypt, len(path.hops) * platform.hop_ns, len(sizes), path)


def mixed_rate(platform: Platform, flags: QueueFlags, io_bytes: int = 4096) -> float:
    """Bytes/s in each direction of ``fio --readwrite=readwrite`` at queue depth 1.

    One job alternates reads and writes at random in equal shares, so each direction
    moves ``io_bytes`` per read-and-write pair.
    """
    pair = io_time(platform, flags, "read", io_bytes).total_ns
    pair += io_time(platform, flags, "write", io_bytes).total_ns
    return io_bytes * 1e9 / pair
