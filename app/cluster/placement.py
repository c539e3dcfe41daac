"""Where a volume is served: the stack rule and least-loaded placement, each written once.

The stack rule: a stacked volume (its table maps ``/dev/mapper/<lower>``) is served by
the node serving its lower volumes, so a whole stack (``StackingGraph.stack_of``) lives
on one node. It decides three things: where a new stacked volume is created
(``stacked_home``), which free leases a node may take and in which order
(``takeover_order``: bottom-up, never an upper whose lower another node serves), and
what a table mapping a volume served elsewhere is told (``served_elsewhere``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from app.db.leases import NodeLoad, Owner
from app.dm.stacking import stacking_order
from app.dm.table import Table
from app.errors import ServedElsewhere


def least_loaded(nodes: Sequence[NodeLoad]) -> NodeLoad | None:
    """The node owning the fewest volumes (ties: by name); None: no node."""
    return min(nodes, key=lambda node: (node.volumes, node.node), default=None)


def served_elsewhere(name: str, node: str | None) -> ServedElsewhere:
    return ServedElsewhere(
        f"volume {name} is served by node {node or '(none yet)'}, not this one: a volume "
        f"that maps /dev/mapper/{name} must be served by the same node (create it "
        f"through any node, it is placed there; or move volume {name} here first)"
    )


class SplitStack(Exception):
    """The volumes a table maps are served by different nodes: no node may serve it."""

    def __init__(self, lowers: Mapping[str, Owner]) -> None:
        served = ", ".join(f"{name} by node {owner.node}" for name, owner in lowers.items())
        super().__init__(
            f"the table maps volumes served by different nodes ({served}); a stacked "
            "volume is served by the node serving every volume it maps: move them "
            "onto one node first"
        )


def stacked_home(lowers: Mapping[str, Owner]) -> Owner:
    """The owner of every volume a new stacked volume maps: where it is created
    (``SplitStack`` if they are not all on one node)."""
    if len({owner.node for owner in lowers.values()}) > 1:
        raise SplitStack(lowers)
    return next(iter(lowers.values()))


@dataclass(frozen=True, slots=True)
class Claimable:
    uuid: str
    name: str
    lowers: frozenset[str]
    """The volumes its tables map: served here before it may be taken."""
    handed: bool
    """Handed to this node by a move (taken at once)."""


def takeover_order(
    claimable: Mapping[str, tuple[str, bool]],
    tables: Mapping[str, Sequence[Table]],
    served: Collection[str],
) -> tuple[list[Claimable], list[str]]:
    """The leases to take now, each after the volumes it maps, and the names left waiting
    (a stacked volume whose lower volume this node neither serves nor takes first).

    ``claimable``: uuid → (name, handed); ``tables``: uuid → its tables; ``served``: the
    volumes this node serves."""
    graph: dict[str, list[Table]] = {name: [] for name in served}
    uuids = {}
    for uuid, (name, _) in claimable.items():
        graph[name] = list(tables[uuid])
        uuids[name] = uuid
    order, stranded = stacking_order(graph)
    return [
        Claimable(
            uuids[name],
            name,
            frozenset().union(*(table.volume_names() for table in graph[name])),
            claimable[uuids[name]][1],
        )
        for name in order
        if name in uuids
    ], stranded
