"""Where a request for a volume not served here goes: the routing decisions, without HTTP."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest

from app.cluster.routing import LOCAL, Elsewhere, Refused, Router
from app.db.leases import NodeLoad, Owner
from app.dm.table import TableLimits


def owner(node: str | None, *, live: bool = True) -> Owner:
    url = None if node is None else f"http://{node}"
    return Owner("u", node, url, 1, datetime.now(UTC), live, 5.0 if live else 0.0)


@dataclass
class FakeLeases:
    owners: dict[str, Owner] = field(default_factory=dict)

    def owner_of(self, name: str) -> Owner | None:
        return self.owners.get(name)


@dataclass
class FakeControl:
    served: set[str] = field(default_factory=set)

    def serves(self, name: str) -> bool:
        return name in self.served


@dataclass
class FakeCluster:
    leases: FakeLeases
    control: FakeControl
    placed: NodeLoad | None = None
    node: str = "a"

    def place(self) -> NodeLoad | None:
        return self.placed


def router(
    owners: dict[str, Owner], *, served: set[str] | None = None, placed: NodeLoad | None = None
) -> Router:
    cluster = FakeCluster(FakeLeases(owners), FakeControl(served or set()), placed)
    return Router(
        cluster,  # type: ignore[arg-type]
        data_path="redirect",
        table_limits=TableLimits(1024, 4096),
    )


def create_body(table: str) -> bytes:
    return json.dumps({"name": "new", "table": table}).encode()


def test_a_volume_nobody_records_is_the_local_routes_to_answer() -> None:
    assert router({}).volume("v", "", forwarded=False) == LOCAL


def test_the_data_path_goes_to_the_owner_as_configured_and_control_calls_are_forwarded() -> None:
    routes = router({"v": owner("b")})
    assert routes.volume("v", "/data", forwarded=False) == Elsewhere("b", "http://b", "redirect")
    assert routes.volume("v", "/suspend", forwarded=False) == Elsewhere("b", "http://b", "forward")


def test_a_forwarded_request_is_never_passed_on_again() -> None:
    route = router({"v": owner("b")}).volume("v", "", forwarded=True)
    assert isinstance(route, Refused)
    assert route.status == 503


@pytest.mark.parametrize("dead", [owner("b", live=False), owner(None)])
def test_a_volume_without_a_live_owner_is_refused_until_it_fails_over(dead: Owner) -> None:
    route = router({"v": dead}).volume("v", "/data", forwarded=False)
    assert isinstance(route, Refused)
    assert route.status == 503


def test_a_new_volume_goes_to_the_least_loaded_node() -> None:
    placed = NodeLoad("c", "http://c", 0)
    assert router({}, placed=placed).create(create_body("0 8 zero")) == Elsewhere(
        "c", "http://c", "forward"
    )


def test_a_stacked_volume_is_created_where_its_lower_volume_is_served() -> None:
    routes = router({"low": owner("b")}, placed=NodeLoad("c", "http://c", 0))
    body = create_body("0 8 linear /dev/mapper/low 0")
    assert routes.create(body) == Elsewhere("b", "http://b", "forward")


def test_a_stacked_volume_over_two_nodes_is_a_conflict() -> None:
    routes = router({"x": owner("a"), "y": owner("b")}, served={"x"})
    body = create_body("0 8 linear /dev/mapper/x 0\n8 8 linear /dev/mapper/y 0")
    route = routes.create(body)
    assert isinstance(route, Refused)
    assert route.status == 409
