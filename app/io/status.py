"""The error vocabulary: what went wrong, named once, for every front end to map once.

The core raises the errors of ``app.errors``; ``status_of`` names each by what it
means to the caller, as the kernel's ``blk_status_t`` names a bio's outcome for
every driver above it. HTTP maps a status to a problem+json status code
(``app.api.problems``), NBD to an errno (``app.nbd.server``); a test holds both
maps total, so a new status cannot reach one front end unmapped.
"""

from __future__ import annotations

from enum import StrEnum

from app import errors


class IoStatus(StrEnum):
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    """Not in this state: suspend first, ``allow_discards``, a device still mapped."""
    INVALID = "invalid"
    MALFORMED_RANGE = "malformed_range"
    OUT_OF_RANGE = "out_of_range"
    PRECONDITION_FAILED = "precondition_failed"
    TOO_LARGE = "too_large"
    NO_SPACE = "no_space"
    TIMEOUT = "timeout"
    """The request itself came too slowly (a body)."""
    IO_ERROR = "io_error"
    """The device or target failed, or something unforeseen did (``BLK_STS_IOERR``)."""
    AGAIN = "again"
    """Not now: suspended too long, at the admission cap, served elsewhere (``BLK_STS_AGAIN``)."""


STATUS_BY_ERROR: dict[type[errors.ReqcryptError], IoStatus] = {
    errors.NotFound: IoStatus.NOT_FOUND,
    errors.Conflict: IoStatus.CONFLICT,
    errors.InvalidInput: IoStatus.INVALID,
    errors.InvalidRange: IoStatus.MALFORMED_RANGE,
    errors.RangeNotSatisfiable: IoStatus.OUT_OF_RANGE,
    errors.PreconditionFailed: IoStatus.PRECONDITION_FAILED,
    errors.PayloadTooLarge: IoStatus.TOO_LARGE,
    errors.InsufficientStorage: IoStatus.NO_SPACE,
    errors.RequestTimeout: IoStatus.TIMEOUT,
    errors.TargetIOError: IoStatus.IO_ERROR,
    errors.Unavailable: IoStatus.AGAIN,
}


def status_of(error: BaseException) -> IoStatus:
    """The nearest class of ``error`` that has a status; a batch by its first failure;
    anything the core did not raise on purpose is an I/O error."""
    if isinstance(error, errors.BatchFailed):
        return status_of(error.cause)
    for cls in type(error).__mro__:
        if cls in STATUS_BY_ERROR:
            return STATUS_BY_ERROR[cls]
    return IoStatus.IO_ERROR
