"""How the suite spreads over pytest-xdist workers: the slow tests first, one worker each.

xdist's work stealing hands each worker a contiguous share of the collection and lets an
idle worker steal the back half of a busy worker's queue. The tests marked ``slow`` (tens
of seconds each, mostly real servers being killed and restarted) are collected first, so
with contiguous shares they would all queue on the first worker and one of them would
still run, alone, after every other test is done. Dealing the first share like cards
starts every worker on its own slow tests; stealing then evens out the fast rest.
"""

from __future__ import annotations

import pytest
from xdist.scheduler import WorkStealingScheduling


def slow_first(items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place: the tests marked ``slow`` first, each group in its order."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


class DealtWorkStealing(WorkStealingScheduling):
    """Work stealing whose first share is dealt round-robin rather than cut in blocks."""

    def check_schedule(self) -> None:
        nodes = [node for node in self.node2pending if not node.shutting_down]
        first_share = self.pending and not any(self.node2pending.values())
        if not first_share or len(nodes) < 2:
            super().check_schedule()
            return
        dealt = [self.pending[index :: len(nodes)] for index in range(len(nodes))]
        self.pending.clear()
        for node, tests in zip(nodes, dealt, strict=True):
            self.node2pending[node].extend(tests)
            node.send_runtest_some(tests)
