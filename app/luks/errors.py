"""LUKS errors, placed in the service's tree so ``api/problems.py`` maps them like any other.

InvalidInput
└── LuksError             (a header refused: checksum, JSON, requirement, cost; or bad options)
NotFound
├── NotLuks               (the device holds no LUKS header)
└── KeyslotNotFound
Conflict
└── LastKeyslot           (killing it would lock the data away for good; ``force`` to do it)
NoKeyAvailable            (no keyslot opens with that passphrase: 403, no hint which)
"""

from __future__ import annotations

from app.errors import Conflict, InvalidInput, NotFound, ReqcryptError


class LuksError(InvalidInput):
    pass


class NotLuks(NotFound):
    pass


class KeyslotNotFound(NotFound):
    pass


class LastKeyslot(Conflict):
    pass


class NoKeyAvailable(ReqcryptError):
    """Every candidate keyslot was tried; the message never says which or why."""

    def __init__(self) -> None:
        super().__init__("no keyslot opens with this passphrase")
