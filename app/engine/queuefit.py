"""Fit dm-crypt's per-hop cost on one published figure per machine; predict the rest.

Each ``QueueCalibration`` is one source's machine: the figures it states about the
hardware (the raw ramdisk, the cipher's speed) become the ``Platform``, one figure of
stock dm-crypt (``fit_on``) fixes ``hop_ns``, and every other figure of the source
(``held_out``) is a prediction that never feeds a fitted parameter. The model is
linear in ``hop_ns`` (queue depth 1: stages add up), so the fit is closed form: the
modelled time at ``hop_ns`` 0 and 1 gives the line, the published figure the point
on it. Priors each platform needs but no figure states are named in ``priors``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from app.engine.kcryptd import (
    DEFAULT_MAX_SIZE,
    STOCK,
    Completion,
    Platform,
    QueueFlags,
    io_time,
    mixed_rate,
)
from app.errors import InvalidInput

__all__ = [
    "QUEUE_CALIBRATIONS",
    "Figure",
    "Prediction",
    "QueueCalibration",
    "QueueFit",
    "fit_hop",
    "predict",
    "predictions_json",
    "render_markdown",
    "split_sweep",
]

KIB = 1024
MIB = 1024 * KIB

Workload = Literal["read", "write", "mixed"]

INLINE = QueueFlags(no_read_workqueue=True, no_write_workqueue=True)


@dataclass(frozen=True, slots=True)
class Figure:
    """One published throughput: ``bytes_per_s`` in each direction, ``shown`` as printed.

    ``workload="mixed"`` is one ``fio --readwrite=readwrite`` job, whose read and
    write rates are one figure (each direction moves a block per read-and-write pair).
    """

    config: str
    flags: QueueFlags
    workload: Workload
    bytes_per_s: float
    shown: str


@dataclass(frozen=True, slots=True)
class QueueCalibration:
    """A source's machine: what it states, the one figure fitted, the figures held out."""

    platform: Platform
    fit_on: Figure
    held_out: tuple[Figure, ...]
    source: str
    stated: tuple[str, ...]
    priors: tuple[str, ...]
    required: bool = True
    """False: shown for information (the issue's check is on the required sources)."""


@dataclass(frozen=True, slots=True)
class Prediction:
    figure: Figure
    modelled_bytes_per_s: float
    hops: tuple[str, ...]

    @property
    def relative_error(self) -> float:
        return self.modelled_bytes_per_s / self.figure.bytes_per_s - 1.0


@dataclass(frozen=True, slots=True)
class QueueFit:
    platform: Platform
    fitted: Prediction
    predictions: tuple[Prediction, ...]


def _rate(platform: Platform, figure: Figure) -> float:
    if figure.workload == "mixed":
        return mixed_rate(platform, figure.flags)
    return 4096 * 1e9 / io_time(platform, figure.flags, figure.workload).total_ns


def _hops(platform: Platform, figure: Figure) -> tuple[str, ...]:
    ops: tuple[Literal["read", "write"], ...] = (
        ("read", "write") if figure.workload == "mixed" else (figure.workload,)
    )
    return tuple(
        f"{op}: {' → '.join(io_time(platform, figure.flags, op).path.hops) or 'none'}" for op in ops
    )


def fit_hop(platform: Platform, fit_on: Figure) -> Platform:
    """``platform`` with the ``hop_ns`` that makes ``fit_on`` come out as published.

    Takes only the platform (the source's stated figures and the priors) and the one
    stock figure: nothing held out can reach the fitted value.
    """

    def pair_ns(hop_ns: float) -> float:
        return 4096 * 1e9 / _rate(dataclasses.replace(platform, hop_ns=hop_ns), fit_on)

    base, slope = pair_ns(0.0), pair_ns(1.0) - pair_ns(0.0)
    if slope <= 0:
        raise InvalidInput(f"{fit_on.config}: takes no hop, so it cannot fix the hop cost")
    hop_ns = (4096 * 1e9 / fit_on.bytes_per_s - base) / slope
    if hop_ns < 0:
        raise InvalidInput(f"{fit_on.config}: faster than the model without hops")
    return dataclasses.replace(platform, hop_ns=hop_ns)


def _predict(platform: Platform, figure: Figure) -> Prediction:
    return Prediction(figure, _rate(platform, figure), _hops(platform, figure))


def predict(calibration: QueueCalibration) -> QueueFit:
    """Fit on ``fit_on`` alone, then model every held-out figure with that platform."""
    platform = fit_hop(calibration.platform, calibration.fit_on)
    return QueueFit(
        platform,
        _predict(platform, calibration.fit_on),
        tuple(_predict(platform, figure) for figure in calibration.held_out),
    )


def _mb(value: float) -> float:
    return value * 1e6


def _mib(value: float) -> float:
    return value * MIB


def _kib(value: float) -> float:
    return value * KIB


_RFC = Platform(
    name="rfc-vm-dd",
    cpus=4,
    io_ns={"read": 4096 * 1e9 / _mb(202), "write": 4096 * 1e9 / _mb(202)},
    hop_ns=0.0,
    encrypt_bytes_per_s=None,
    decrypt_bytes_per_s=None,
    completion=Completion(kernel=(5, 8)),
)
_V2 = dataclasses.replace(  # the same VM, measured with fio
    _RFC, name="rfc-vm-fio", io_ns={"read": 4096 * 1e9 / _mib(508), "write": 4096 * 1e9 / _mib(516)}
)
_BLOG_PAIR_NS = 4096 * 1e9 / _mib(1126.5)
_BLOG = Platform(
    name="cloudflare-g9",
    cpus=None,
    io_ns={"read": _BLOG_PAIR_NS / 2, "write": _BLOG_PAIR_NS / 2},
    hop_ns=0.0,
    encrypt_bytes_per_s=_mib(1823.1),
    decrypt_bytes_per_s=_mib(1900.3),
    device_bytes_per_s=8e9,
    completion=Completion(kernel=(5, 4)),
)

QUEUE_CALIBRATIONS: dict[str, QueueCalibration] = {
    "rfc": QueueCalibration(
        platform=_RFC,
        fit_on=Figure("stock", STOCK, "read", _mb(80.7), "80.7 MB/s"),
        held_out=(Figure("force_inline", INLINE, "read", _mb(201), "201 MB/s"),),
        source=(
            "[RFC PATCH 0/1] dm-crypt excessive overhead (dm-devel, 2020-06-19): VirtualBox, "
            "4 cores of a 2.8 GHz Core i7, 5.8-rc1, 4 GiB brd, capi:ecb(cipher_null), "
            "dd bs=4k iflag=direct"
        ),
        stated=("ram0 read 202 MB/s (dd)", "4 CPUs", "cipher_null: no cipher time"),
        priors=("512 B data units (the table's default)", "unit_ns 0 (not identifiable)"),
    ),
    "blog": QueueCalibration(
        platform=_BLOG,
        fit_on=Figure("stock", STOCK, "mixed", _kib(150874), "150874 / 151170 KB/s"),
        held_out=(
            Figure(
                "same_cpu_crypt",
                QueueFlags(same_cpu_crypt=True),
                "mixed",
                _kib(139811),
                "139811 / 140192 KB/s",
            ),
            Figure(
                "submit_from_crypt_cpus",
                QueueFlags(submit_from_crypt_cpus=True),
                "mixed",
                _kib(169835),
                "169835 / 169965 KB/s",
            ),
            Figure(
                "inline (xtsproxy, both workqueues off)",
                INLINE,
                "mixed",
                _mb(320),
                "≈ 640 MB/s in all (graph)",
            ),
        ),
        source=(
            "Speeding up Linux disk encryption (Cloudflare blog, 2020-03-25): a G9 server, "
            "4 GB brd, LUKS aes-xts-plain64 256-bit, one fio job --readwrite=readwrite "
            "--bs=4k --direct=1, psync, queue depth 1 (fio 2 units: KB = 1024 B)"
        ),
        stated=(
            "ram0 1126.5 / 1126.1 MB/s (fio, same job)",
            "cryptsetup benchmark aes-xts 256b 1823.1 / 1900.3 MiB/s (64 KiB calls)",
        ),
        priors=(
            "512 B data units (LUKS2's default sector size in 2020)",
            "unit_ns 0 (not identifiable)",
            "ram0 read and write take equal time",
            "brd 8 GB/s past 4 KiB (only the split sweep uses it)",
            "the CPU count is not stated: the split sweep names its own",
        ),
    ),
    "rfc-v2": QueueCalibration(
        platform=_V2,
        fit_on=Figure("stock", STOCK, "read", _mib(80.6), "80.6 MiB/s"),
        held_out=(
            Figure("stock", STOCK, "write", _mib(40.4), "40.4 MiB/s"),
            Figure(
                "no_read_workqueue",
                QueueFlags(no_read_workqueue=True),
                "read",
                _mib(295),
                "295 MiB/s",
            ),
            Figure(
                "no_read_workqueue",
                QueueFlags(no_read_workqueue=True),
                "write",
                _mib(38.9),
                "38.9 MiB/s",
            ),
            Figure(
                "no_write_workqueue",
                QueueFlags(no_write_workqueue=True),
                "read",
                _mib(114),
                "114 MiB/s",
            ),
            Figure(
                "no_write_workqueue",
                QueueFlags(no_write_workqueue=True),
                "write",
                _mib(277),
                "277 MiB/s",
            ),
        ),
        source=(
            "[PATCH v2] the same thread's v2 (2020-06-26): the same VM, 5.8-rc2, fio "
            "--bs=4k --direct=1, read and write run separately"
        ),
        stated=("ram0 508 / 516 MiB/s (fio)", "4 CPUs", "cipher_null: no cipher time"),
        priors=("512 B data units", "unit_ns 0 (not identifiable)"),
        required=False,
    ),
}


@dataclass(frozen=True, slots=True)
class SplitPoint:
    label: str
    op: Literal["read", "write"]
    split_bytes: int | None
    mb_per_s: float


SPLIT_SIZES = (16 * KIB, 32 * KIB, 64 * KIB, DEFAULT_MAX_SIZE, 256 * KIB, 512 * KIB, MIB)


def split_sweep(
    platform: Platform, cpus: Sequence[int] = (1, 4, 16), io_bytes: int = MIB
) -> list[SplitPoint]:
    """1 MiB throughput against ``max_read_size`` / ``max_write_size`` (6.11) per CPU count.

    Unbound ``kcryptd`` spreads the pieces over the CPUs; ``same_cpu_crypt`` keeps them
    on one, as a contrast at the largest CPU count.
    """
    points = []
    variants = [(f"{n} CPU{'s' if n > 1 else ''}", QueueFlags(), n) for n in cpus]
    most = max(cpus)
    variants.append((f"{most} CPUs, same_cpu_crypt", QueueFlags(same_cpu_crypt=True), most))
    for label, flags, count in variants:
        for size in SPLIT_SIZES:
            sized = dataclasses.replace(flags, max_read_size=size, max_write_size=size)
            for op in ("read", "write"):
                time = io_time(platform, sized, op, io_bytes, cpus=count).total_ns
                points.append(SplitPoint(label, op, size, io_bytes / time * 1e3))
    return points


def _row(prediction: Prediction, role: str) -> str:
    figure = prediction.figure
    modelled = prediction.modelled_bytes_per_s
    shown = f"{modelled / MIB:.1f} MiB/s ({modelled / 1e6:.1f} MB/s)"
    error = "fitted" if role == "fit" else f"{prediction.relative_error:+.1%}"
    return (
        f"| {figure.config} | {figure.workload} | {figure.shown} | {shown} | {error} "
        f"| {'; '.join(prediction.hops)} |"
    )


def predictions_json() -> list[dict[str, object]]:
    """Every source's figures, fitted and held out, as the API records them."""
    rows: list[dict[str, object]] = []
    for name, calibration in QUEUE_CALIBRATIONS.items():
        result = predict(calibration)
        for role, prediction in [("fitted", result.fitted)] + [
            ("held out", p) for p in result.predictions
        ]:
            figure = prediction.figure
            rows.append(
                {
                    "source": name,
                    "required": calibration.required,
                    "role": role,
                    "configuration": figure.config,
                    "workload": figure.workload,
                    "published": figure.shown,
                    "published_bytes_per_s": figure.bytes_per_s,
                    "modelled_bytes_per_s": prediction.modelled_bytes_per_s,
                    "relative_error": prediction.relative_error,
                    "hop_ns": result.platform.hop_ns,
                    "hops": list(prediction.hops),
                }
            )
    return rows


def render_markdown() -> str:
    """Per source: what it states, the fitted hop, predicted vs published."""
    lines: list[str] = []
    for name, calibration in QUEUE_CALIBRATIONS.items():
        result = predict(calibration)
        role = "held out" if calibration.required else "held out, for information"
        lines += [f"### {name}: {result.platform.name}", "", calibration.source, ""]
        lines.append(f"Stated: {'; '.join(calibration.stated)}.")
        lines.append(f"Priors: {'; '.join(calibration.priors)}.")
        lines.append(
            f"Fitted on `{calibration.fit_on.config}` alone: hop {result.platform.hop_ns / 1e3:.2f} µs."
        )
        lines += [
            "",
            f"| configuration | I/O | published | modelled | error ({role}) | hops |",
            "|---|---|---|---|---|---|",
            _row(result.fitted, "fit"),
        ]
        lines += [_row(prediction, "held out") for prediction in result.predictions]
        lines.append("")
    return "\n".join(lines)
