"""Who maps whom: live and inactive tables both count, for every question asked of the graph."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.dm.stacking import StackingGraph, stacking_order
from app.dm.table import Table, parse_table


@dataclass
class FakeVolume:
    live: list[Table] = field(default_factory=list)

    def tables(self) -> list[Table]:
        return self.live


def over(*names: str) -> Table:
    text = "\n".join(f"{i * 8} 8 linear /dev/mapper/{name} 0" for i, name in enumerate(names))
    return parse_table(text)


def test_users_and_open_count_count_inactive_tables_too() -> None:
    volumes = {
        "lower": FakeVolume(),
        "upper": FakeVolume([parse_table("0 8 zero"), over("lower")]),
        "side": FakeVolume([over("lower")]),
    }
    graph = StackingGraph(volumes)
    assert graph.volume_users("lower") == ["side", "upper"]
    assert graph.open_count("lower") == 2
    assert graph.volume_users("upper") == []


def test_a_cycle_through_an_inactive_table_is_found() -> None:
    volumes = {"a": FakeVolume([parse_table("0 8 zero"), over("b")]), "b": FakeVolume()}
    graph = StackingGraph(volumes)
    assert graph.would_cycle("b", over("a"))
    assert not graph.would_cycle("b", parse_table("0 8 zero"))


def test_stacking_order_builds_mapped_volumes_first_and_names_the_stranded() -> None:
    order, stranded = stacking_order(
        {"top": [over("mid")], "mid": [over("base")], "base": [], "lost": [over("gone")]}
    )
    assert order == ["base", "mid", "top"]
    assert stranded == ["lost"]


def test_a_stack_is_every_volume_linked_either_way_bottom_up() -> None:
    """Naming the middle of a stack finds its lower volumes, their other users, and the
    second lower volume of a volume mapping two: all must stay on one node."""
    volumes = {
        "base": FakeVolume(),
        "other": FakeVolume(),
        "mid": FakeVolume([over("base")]),
        "top": FakeVolume([over("mid", "other")]),
        "side": FakeVolume([over("base")]),
        "alone": FakeVolume(),
    }
    stack = StackingGraph(volumes).stack_of("mid")
    assert sorted(stack) == ["base", "mid", "other", "side", "top"]
    assert stack.index("base") < stack.index("mid") < stack.index("top")
    assert stack.index("other") < stack.index("top")


def test_bottom_up_puts_every_volume_after_what_it_maps() -> None:
    volumes = {
        "top": FakeVolume([over("mid")]),
        "mid": FakeVolume([over("base")]),
        "base": FakeVolume(),
    }
    assert StackingGraph(volumes).bottom_up() == ["base", "mid", "top"]
