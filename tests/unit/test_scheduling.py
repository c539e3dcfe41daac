"""The suite's xdist scheduler: every worker starts on its own slow tests, and work stealing
still runs every test exactly once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.support.scheduling import DealtWorkStealing, slow_first


class Worker:
    """What the scheduler asks of a worker: the tests it is sent, in order."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def send_steal(self, indices: list[int]) -> None:
        pass

    def shutdown(self) -> None:
        self.shutting_down = True


def scheduler(workers: list[Worker], collection: list[str]) -> DealtWorkStealing:
    config = SimpleNamespace(getvalue=lambda name: [f"{len(workers)}*popen"])
    scheduling = DealtWorkStealing(config)  # type: ignore[arg-type]
    for worker in workers:
        scheduling.add_node(worker)  # type: ignore[arg-type]
    for worker in workers:
        scheduling.add_node_collection(worker, collection)  # type: ignore[arg-type]
    scheduling.schedule()
    return scheduling


def test_the_first_share_is_dealt_round_robin_so_each_worker_starts_on_a_slow_test() -> None:
    workers = [Worker("gw0"), Worker("gw1"), Worker("gw2")]
    collection = ["slow-a", "slow-b", "slow-c", *(f"fast-{n}" for n in range(9))]
    scheduler(workers, collection)
    assert [collection[worker.sent[0]] for worker in workers] == ["slow-a", "slow-b", "slow-c"]
    sent = sorted(index for worker in workers for index in worker.sent)
    assert sent == list(range(len(collection)))


def test_after_the_first_share_stealing_works_as_xdist_does() -> None:
    workers = [Worker("gw0"), Worker("gw1")]
    scheduling = scheduler(workers, [f"t{n}" for n in range(10)])
    first = list(workers[0].sent)
    for index in first:
        scheduling.mark_test_complete(workers[0], index)  # type: ignore[arg-type]
    assert scheduling.steal_requested_from_node is workers[1]


def test_slow_tests_are_collected_first_each_group_in_its_order() -> None:
    def item(name: str, slow: bool) -> SimpleNamespace:
        marker = pytest.mark.slow.mark if slow else None
        return SimpleNamespace(name=name, get_closest_marker=lambda _: marker)

    items = [item("a", False), item("b", True), item("c", False), item("d", True)]
    slow_first(items)  # type: ignore[arg-type]
    assert [i.name for i in items] == ["b", "d", "a", "c"]
