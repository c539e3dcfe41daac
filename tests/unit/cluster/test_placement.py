"""The stack rule and least-loaded placement: pure decisions over what SQL said."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from app.cluster.placement import (
    SplitStack,
    least_loaded,
    served_elsewhere,
    stacked_home,
    takeover_order,
)
from app.db.leases import NodeLoad, Owner
from app.dm.table import parse_table


def owner(node: str, uuid: str = "u") -> Owner:
    return Owner(uuid, node, f"http://{node}", 1, datetime.now(UTC), True, 5.0)


def test_the_least_loaded_node_is_chosen_and_a_tie_goes_by_name() -> None:
    nodes = [NodeLoad("c", "http://c", 1), NodeLoad("b", "http://b", 1), NodeLoad("a", "", 3)]
    assert least_loaded(nodes) == nodes[1]


def test_no_live_node_places_nothing() -> None:
    assert least_loaded([]) is None


def test_a_stacked_volume_is_created_where_its_lower_volumes_are_served() -> None:
    lowers = {"x": owner("b", "1"), "y": owner("b", "2")}
    assert stacked_home(lowers) == lowers["x"]


def test_a_table_mapping_volumes_of_two_nodes_has_no_home() -> None:
    with pytest.raises(SplitStack, match="x by node a, y by node b"):
        stacked_home({"x": owner("a"), "y": owner("b")})


def test_a_table_mapping_a_volume_served_elsewhere_names_its_node() -> None:
    assert "volume x is served by node b, not this one" in served_elsewhere("x", "b").detail


def test_leases_are_taken_bottom_up_and_an_upper_waits_for_a_lower_served_nowhere_here() -> None:
    claimable = {"u-up": ("up", False), "u-low": ("low", True), "u-lone": ("lone", False)}
    tables = {
        "u-up": [parse_table("0 8 linear /dev/mapper/low 0")],
        "u-low": [parse_table("0 8 zero")],
        "u-lone": [parse_table("0 8 linear /dev/mapper/elsewhere 0")],
    }
    order, waiting = takeover_order(claimable, tables, served=[])
    assert [(c.name, sorted(c.lowers), c.handed) for c in order] == [
        ("low", [], True),
        ("up", ["low"], False),
    ]
    assert waiting == ["lone"]


def test_an_upper_whose_lower_this_node_serves_is_taken() -> None:
    claimable = {"u-up": ("up", False)}
    tables = {"u-up": [parse_table("0 8 linear /dev/mapper/low 0")]}
    order, waiting = takeover_order(claimable, tables, served=["low"])
    assert [c.name for c in order] == ["up"]
    assert waiting == []
