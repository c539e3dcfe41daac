"""Domain errors of the core, with no HTTP in them.

``app.io.status`` names each class's meaning to a caller once (the error
vocabulary), which HTTP maps to a status code and NBD to an errno; the core only
raises. Messages must never contain key material: table text reaches a message
only through ``app.dm.table.redact``.

    ReqcryptError
    ├── NotFound
    │   ├── DeviceNotFound, VolumeNotFound, EngineNotFound,
    │   └── DeviceModelNotFound, BenchmarkNotFound
    ├── Conflict
    │   ├── AlreadyExists
    │   ├── DeviceBusy, VolumeBusy
    │   │   └── DeviceClaimed     (another live process holds the device: a cluster node)
    │   ├── InvalidState          (wrong lifecycle state for the operation)
    │   ├── ServedElsewhere       (a table stacks onto a volume another cluster node serves)
    │   ├── KeyNotSet
    │   └── QuotaExceeded         (as many devices or volumes as the service allows)
    ├── InvalidInput
    │   ├── TableError            (line, field, reason)
    │   ├── CipherSpecError
    │   └── InvalidRange
    ├── RangeNotSatisfiable       (size of the volume)
    ├── PreconditionFailed
    ├── PayloadTooLarge
    ├── InsufficientStorage       (the devices' sizes would exceed the service's total)
    ├── RequestTimeout            (a request body arrived too slowly)
    ├── TargetIOError             (error target, device failure)
    ├── Unavailable               (suspended too long; retry_after seconds)
    │   ├── LeaseExpired          (past this node's lease deadline on the volume)
    │   └── Fenced                (another node took the device over; this one may not write)
    └── BatchFailed               (some writes of a batch; the first one's cause)
"""

from __future__ import annotations


class ReqcryptError(Exception):
    """Root of every error the core raises on purpose."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class NotFound(ReqcryptError):
    pass


class DeviceNotFound(NotFound):
    pass


class VolumeNotFound(NotFound):
    pass


class EngineNotFound(NotFound):
    pass


class DeviceModelNotFound(NotFound):
    pass


class BenchmarkNotFound(NotFound):
    pass


class Conflict(ReqcryptError):
    pass


class AlreadyExists(Conflict):
    pass


class DeviceBusy(Conflict):
    pass


class VolumeBusy(Conflict):
    pass


class DeviceClaimed(DeviceBusy):
    pass


class InvalidState(Conflict):
    pass


class ServedElsewhere(Conflict):
    pass


class KeyNotSet(Conflict):
    pass


class QuotaExceeded(Conflict):
    pass


class InvalidInput(ReqcryptError):
    pass


class CipherSpecError(InvalidInput):
    """A cipher specification or key that dm-crypt would refuse."""


class TableError(InvalidInput):
    """A table line refused, located like the kernel's ``dm_table_add_target`` errors."""

    def __init__(self, line: int, field: str, reason: str) -> None:
        super().__init__(f"line {line}: {field}: {reason}")
        self.line = line
        self.field = field
        self.reason = reason


class InvalidRange(InvalidInput):
    pass


class RangeNotSatisfiable(ReqcryptError):
    def __init__(self, detail: str, size: int) -> None:
        super().__init__(detail)
        self.size = size


class PreconditionFailed(ReqcryptError):
    pass


class PayloadTooLarge(ReqcryptError):
    pass


class InsufficientStorage(ReqcryptError):
    pass


class RequestTimeout(ReqcryptError):
    pass


class TargetIOError(ReqcryptError):
    pass


class Unavailable(ReqcryptError):
    def __init__(self, detail: str, retry_after: int = 1) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


class Fenced(Unavailable):
    """The backing store refused I/O: another node claimed the device (and fenced this
    one). 503: the volume is served elsewhere, the caller retries and is redirected."""


class LeaseExpired(Unavailable):
    """The node's lease on the volume ran out (or moved): it takes no more I/O for it."""


class BatchFailed(ReqcryptError):
    """Some writes of a batch failed; the others were written (each is independent)."""

    def __init__(self, detail: str, cause: BaseException, failed: list[dict[str, object]]) -> None:
        super().__init__(detail)
        self.cause = cause
        self.failed = failed
