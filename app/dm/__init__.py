"""Device-mapper: the table grammar, targets and volume lifecycle.

Owns dmsetup semantics (parse/format tables, create/load/suspend/resume/remove).
Must not import fastapi or sqlalchemy: the API and the database sit above it.
"""

from app.dm.table import (
    CryptParams,
    DeviceRef,
    DeviceSizes,
    ErrorParams,
    LinearParams,
    Table,
    TableLine,
    TargetParams,
    ZeroParams,
    format_table,
    normalize,
    parse_table,
    redact,
)

__all__ = [
    "CryptParams",
    "DeviceRef",
    "DeviceSizes",
    "ErrorParams",
    "LinearParams",
    "Table",
    "TableLine",
    "TargetParams",
    "ZeroParams",
    "format_table",
    "normalize",
    "parse_table",
    "redact",
]
