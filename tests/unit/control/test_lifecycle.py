"""ADR 0003 at the repository seam: when the commit fails, memory and SQL both stay as they were."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from app.blk.tuning import TuningPatch
from app.control import Control
from app.db.records import Records, RecordsTx
from app.dm.table import format_table
from tests.support.keys import XTS_KEY


class CommitFails(Records):
    """Runs every row operation, then fails instead of committing (the transaction rolls back)."""

    failing = False

    @contextmanager
    def transaction(self) -> Iterator[RecordsTx]:
        with super().transaction() as records:
            yield records
            if self.failing:
                raise ConnectionError("the database went away at commit")


def snapshot(control: Control) -> dict[str, Any]:
    return {
        "devices": control.device_names(),
        "volumes": {
            name: (
                volume.name,
                volume.state,
                volume.event_nr,
                volume.dispatch_mode,
                format_table(volume.live.table, show_keys=True) if volume.live else None,
                format_table(volume.inactive, show_keys=True) if volume.inactive else None,
            )
            for name, volume in sorted(control.volumes.items())
        },
    }


OPERATIONS: dict[str, Callable[[Control], object]] = {
    "create device": lambda c: c.create_device("spare", 1 << 20, None),
    "delete device": lambda c: c.delete_device("unused"),
    "create volume": lambda c: c.create_volume("new", "0 8 zero"),
    "load": lambda c: c.load_table("lower", f"0 1024 crypt aes-xts-plain64 {XTS_KEY} 0 pv 0"),
    "clear": lambda c: c.clear_inactive("upper"),
    "suspend": lambda c: c.suspend("lower", noflush=False),
    "resume": lambda c: c.resume("held"),
    "key wipe": lambda c: c.message("held", "key wipe"),
    "rename": lambda c: c.rename("lower", "renamed"),
    "remove": lambda c: c.remove("upper"),
    "retune": lambda c: c.retune("lower", patch=TuningPatch(dispatch_mode="bio")),
}


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_a_failed_commit_leaves_memory_and_sql_as_they_were(
    operation: str, make_control: Callable[..., Control]
) -> None:
    control = make_control(CommitFails)
    control.create_device("pv", 1 << 20, None)
    control.create_device("unused", 1 << 20, None)
    control.create_volume("lower", f"0 2048 crypt aes-xts-plain64 {XTS_KEY} 0 pv 0")
    control.create_volume("upper", "0 8 zero")
    control.load_table("upper", "0 8 error")
    control.create_volume("held", f"0 2048 crypt aes-xts-plain64 {XTS_KEY} 0 pv 0")
    control.suspend("held", noflush=False)
    before = snapshot(control)
    records = control.records
    assert isinstance(records, CommitFails)
    records.failing = True
    with pytest.raises(ConnectionError):
        OPERATIONS[operation](control)
    assert snapshot(control) == before
    control.close()
    assert snapshot(make_control()) == before
