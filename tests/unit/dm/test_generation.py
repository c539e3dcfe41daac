"""The version sequence lock and the range lock let go on every way out of their block."""

from __future__ import annotations

import threading

import pytest

from app.blk.wait import WouldBlock
from app.dm.generation import Generation
from app.dm.rangelock import RangeLock
from app.errors import PreconditionFailed


class Boom(Exception):
    """What the blocks under test fail with."""


def conditional_enters(generation: Generation) -> bool:
    """Whether another thread gets through ``conditional`` (not left waiting on its lock)."""
    entered = threading.Event()

    def enter() -> None:
        with generation.conditional(lambda version: True):
            entered.set()

    thread = threading.Thread(target=enter, daemon=True)
    thread.start()
    return entered.wait(2)


def test_a_write_makes_the_next_version_even_when_it_fails() -> None:
    generation = Generation()
    with generation.writing() as made:
        assert generation.snapshot() is None  # a write in flight: no version to serve
    assert made == [1]

    def failing_write() -> None:
        with generation.writing() as made:
            assert made == []  # filled only once the write ends
            raise Boom

    with pytest.raises(Boom):
        failing_write()
    assert generation.value == 2
    assert generation.snapshot() == (2, 2)


def test_a_failed_precondition_raises_and_lets_go_of_the_lock() -> None:
    generation = Generation()
    with pytest.raises(PreconditionFailed), generation.conditional(lambda version: version == 7):
        pytest.fail("the block ran under a failed precondition")
    assert conditional_enters(generation)


def test_a_precondition_that_raises_lets_go_of_the_lock() -> None:
    generation = Generation()

    def broken(version: int) -> bool:
        raise KeyError(version)

    with pytest.raises(KeyError), generation.conditional(broken):
        pytest.fail("the block ran under a broken precondition")
    assert conditional_enters(generation)


def test_a_conditional_block_holds_the_lock_until_it_ends_even_by_an_error() -> None:
    generation = Generation()

    def failing_block() -> None:
        with generation.conditional(lambda version: version == 0):
            assert not generation._conditional.acquire(blocking=False)
            raise Boom

    with pytest.raises(Boom):
        failing_block()
    assert conditional_enters(generation)
    with generation.conditional(None):
        assert generation._conditional.acquire(blocking=False)  # no precondition: no lock
        generation._conditional.release()


def test_a_range_held_exclusive_is_given_back_when_its_block_raises() -> None:
    lock = RangeLock()

    def failing_block() -> None:
        with lock.hold(0, 4096, exclusive=True):
            with pytest.raises(WouldBlock), lock.hold_shared([(512, 1024)], wait=False):
                pass
            raise Boom

    with pytest.raises(Boom):
        failing_block()
    with lock.hold_shared([(512, 1024)], wait=False), lock.hold(2048, 4096, exclusive=False):
        assert lock._held == [(512, 1024, False), (2048, 4096, False)]
    assert lock._held == []
