"""Target types: what a table line does with the sectors it maps (``struct target_type``)."""

from __future__ import annotations

from app.dm.targets.base import BlockDevice, MapContext, MapResult, Target
from app.dm.targets.crypt import CryptTarget, crypt_message
from app.dm.targets.error import ErrorTarget
from app.dm.targets.linear import LinearTarget
from app.dm.targets.zero import ZeroTarget

__all__ = [
    "BlockDevice",
    "CryptTarget",
    "ErrorTarget",
    "LinearTarget",
    "MapContext",
    "MapResult",
    "Target",
    "ZeroTarget",
    "crypt_message",
]
