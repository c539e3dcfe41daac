"""``Control`` asks its guard, and only its guard, whether it may serve and write."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from app.control import Control
from app.control.guard import SingleNode
from app.db.records import RecordsTx
from app.dm.volume import Volume
from app.errors import LeaseExpired, ReqcryptError, ServedElsewhere


class Refusing(SingleNode):
    """A guard that loses every volume once told to (``refuse``), and names another node
    for any volume a table maps that is not served here."""

    refuse = False

    def check(self, records: RecordsTx, volume: Volume) -> None:
        if self.refuse:
            raise LeaseExpired(f"this node no longer holds the lease on volume {volume.name}")

    def not_served(self, name: str) -> ReqcryptError:
        return ServedElsewhere(f"volume {name} is served by node b")


def test_a_write_the_guard_refuses_changes_neither_sql_nor_memory(
    make_control: Callable[..., Control],
) -> None:
    guard = Refusing()
    control = make_control(guard=guard)
    control.create_volume("v", "0 8 zero")
    guard.refuse = True
    with pytest.raises(LeaseExpired):
        control.suspend("v", noflush=False)
    assert control.volume("v").state == "active"
    control.close()
    assert make_control().volume("v").state == "active"


def test_a_table_mapping_a_volume_not_served_here_is_told_why_by_the_guard(
    make_control: Callable[..., Control],
) -> None:
    control = make_control(guard=Refusing())
    with pytest.raises(ServedElsewhere, match="served by node b"):
        control.create_volume("upper", "0 8 linear /dev/mapper/lower 0")
