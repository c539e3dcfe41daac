"""The block I/O history recorder and its checker (tests/support/history.py): each rule
passes what a correct block device may do and fails, under that rule alone, what it may not."""

from __future__ import annotations

import itertools
import random
import threading
from dataclasses import dataclass

import pytest

from tests.support.history import (
    DEFAULT_VOLUME,
    INITIAL,
    History,
    Kind,
    Operation,
    Rule,
    Status,
    Value,
    accepting_from_writes,
    check,
)


def ticking() -> History:
    """A history whose clock ticks once per event, so the order of calls is real time."""
    return History(clock=itertools.count(1).__next__)


def write(
    history: History,
    process: int,
    block: int,
    value: Value,
    *,
    node: str | None = None,
    volume: str = DEFAULT_VOLUME,
) -> Operation:
    return history.ok(
        history.invoke(process, "write", volume=volume, block=block, value=value, node=node)
    )


def read(
    history: History, process: int, block: int, value: Value, *, final: bool = False
) -> Operation:
    return history.ok(history.invoke(process, "read", block=block, final=final), value=value)


def flush(history: History, process: int) -> Operation:
    return history.ok(history.invoke(process, "flush"))


def test_a_valid_concurrent_history_is_valid() -> None:
    history = ticking()
    a = history.invoke(1, "write", block=0, value="a")
    b = history.invoke(2, "write", block=0, value="b")
    history.ok(history.invoke(3, "read", block=0), value="b")
    history.ok(a)
    late = history.invoke(3, "read", block=0)
    history.ok(b)
    history.ok(late, value="a")
    read(history, 4, 1, INITIAL)
    write(history, 4, 1, "c")
    flush(history, 4)
    read(history, 1, 1, "c", final=True)
    read(history, 2, 0, "a", final=True)

    verdict = check(history)

    assert verdict.valid, verdict
    assert str(verdict) == "valid: 9 operations"


def test_a_read_after_a_completed_write_returning_the_older_value_is_not_linearizable() -> None:
    history = ticking()
    write(history, 1, 0, "a")
    write(history, 1, 0, "b")
    read(history, 2, 0, "a")

    assert check(history).rules == {Rule.LINEARIZABILITY}


def test_a_read_that_sees_a_value_then_an_older_one_is_not_linearizable() -> None:
    history = ticking()
    write(history, 1, 0, "a")
    b = history.invoke(1, "write", block=0, value="b")
    read(history, 2, 0, "b")
    read(history, 3, 0, "a")
    history.ok(b)

    assert check(history).rules == {Rule.LINEARIZABILITY}


@pytest.mark.parametrize("value", ["a", "b"])
def test_concurrent_writes_may_take_effect_in_either_order(value: Value) -> None:
    history = ticking()
    a = history.invoke(1, "write", block=0, value="a")
    b = history.invoke(2, "write", block=0, value="b")
    read(history, 3, 0, value)
    read(history, 3, 0, "b" if value == "a" else "a")
    history.ok(a)
    history.ok(b)

    assert check(history).valid


def test_concurrent_writes_take_effect_once() -> None:
    history = ticking()
    a = history.invoke(1, "write", block=0, value="a")
    b = history.invoke(2, "write", block=0, value="b")
    read(history, 3, 0, "a")
    read(history, 3, 0, "b")
    read(history, 3, 0, "a")
    history.ok(a)
    history.ok(b)

    assert check(history).rules == {Rule.LINEARIZABILITY}


def test_a_stale_read_is_reported_with_the_writes_around_it() -> None:
    history = ticking()
    a = write(history, 1, 0, "a")
    b = write(history, 1, 0, "b")
    stale = read(history, 2, 0, "a")

    (violation,) = check(history).violations

    assert (violation.volume, violation.block, violation.ops) == ("volume", 0, (a, b, stale))
    assert str(violation).splitlines()[0] == (
        "linearizability: volume 'volume' block 0:"
        " #3 returns 'a' (written by #1), which #2 overwrote before it was invoked"
    )


def test_a_history_with_no_stale_read_is_reported_where_the_search_got_stuck() -> None:
    history = ticking()
    a = write(history, 1, 0, "a")
    b = history.invoke(1, "write", block=0, value="b")
    newer = read(history, 2, 0, "b")
    older = read(history, 3, 0, "a")
    b = history.ok(b)

    (violation,) = check(history).violations

    assert violation.ops == (a, b, newer, older)
    assert violation.detail == (
        "at best 1 of 4 operations take effect in a valid order, leaving 'a' (written by #1),"
        " still to be read by #4; next must come one of #2, #3 (before #3 completes),"
        " and none fits"
    )


@pytest.mark.parametrize("returned", [INITIAL, "a"])
def test_a_final_read_older_than_a_flushed_write_is_a_lost_flushed_write(returned: Value) -> None:
    history = ticking()
    write(history, 1, 0, "a")
    b = write(history, 1, 0, "b")
    flushed = flush(history, 1)
    history.crash()
    final = read(history, 2, 0, returned, final=True)

    (violation,) = check(history).violations

    assert violation.rule is Rule.LOST_FLUSHED_WRITE
    assert violation.ops[:3] == (b, flushed, final)


def test_an_unflushed_write_lost_in_a_crash_is_no_violation() -> None:
    history = ticking()
    write(history, 1, 0, "a")
    flush(history, 1)
    write(history, 1, 0, "b")
    history.crash()
    read(history, 2, 0, "a", final=True)

    assert check(history).valid


def test_an_unflushed_write_that_disappears_without_a_crash_is_a_stale_read() -> None:
    history = ticking()
    write(history, 1, 0, "a")
    flush(history, 1)
    write(history, 1, 0, "b")
    read(history, 2, 0, "a", final=True)

    assert check(history).rules == {Rule.LINEARIZABILITY}


def test_a_crash_cannot_revert_a_block_past_a_flushed_write() -> None:
    history = ticking()
    write(history, 1, 0, "a")
    flush(history, 1)
    history.crash()
    read(history, 2, 0, INITIAL)

    assert check(history).rules == {Rule.LINEARIZABILITY}


def test_after_a_crash_the_lost_write_does_not_come_back() -> None:
    history = ticking()
    write(history, 1, 0, "a")
    flush(history, 1)
    write(history, 1, 0, "b")
    history.crash()
    read(history, 2, 0, "a")
    read(history, 2, 0, "b")

    assert check(history).rules == {Rule.LINEARIZABILITY}


def test_a_flush_makes_durable_only_its_own_process_writes() -> None:
    history = ticking()
    write(history, 1, 0, "a")
    flush(history, 2)
    history.crash()
    read(history, 2, 0, INITIAL, final=True)

    assert check(history).valid


def test_a_flush_after_a_crash_does_not_vouch_for_writes_before_the_crash() -> None:
    history = ticking()
    write(history, 1, 0, "a")
    history.crash()
    flush(history, 1)
    read(history, 2, 0, INITIAL, final=True)

    assert check(history).valid


def test_a_crash_of_another_volume_loses_nothing_here() -> None:
    history = ticking()
    write(history, 1, 0, "a")
    history.crash("other")
    read(history, 2, 0, INITIAL)

    assert check(history).rules == {Rule.LINEARIZABILITY}


def test_a_read_of_a_value_never_written_is_reported() -> None:
    history = ticking()
    write(history, 1, 0, "a")
    ghost = read(history, 2, 0, "ghost")

    (violation,) = check(history).violations

    assert (violation.rule, violation.ops) == (Rule.NEVER_WRITTEN, (ghost,))


def test_a_read_of_a_value_written_to_another_block_is_never_written_here() -> None:
    history = ticking()
    elsewhere = write(history, 1, 7, "a")
    misread = read(history, 2, 0, "a")

    (violation,) = check(history).violations

    assert (violation.rule, violation.ops) == (Rule.NEVER_WRITTEN, (misread, elsewhere))
    assert "[('volume', 7)]" in violation.detail


def test_a_read_of_a_value_written_only_after_the_read_completed_is_never_written() -> None:
    history = ticking()
    read(history, 2, 0, "a")
    write(history, 1, 0, "a")

    assert check(history).rules == {Rule.NEVER_WRITTEN}


def test_a_read_of_a_failed_writes_value_is_reported() -> None:
    history = ticking()
    failed = history.fail(history.invoke(1, "write", block=0, value="a"))
    seen = read(history, 2, 0, "a")

    (violation,) = check(history).violations

    assert (violation.rule, violation.ops) == (Rule.FAILED_WRITE_READ, (seen, failed))


def test_a_failed_write_never_takes_effect() -> None:
    history = ticking()
    write(history, 1, 0, "a")
    history.fail(history.invoke(1, "write", block=0, value="b"))
    read(history, 2, 0, "a")

    assert check(history).valid


@pytest.mark.parametrize("seen", ["a", "b"])
def test_an_info_write_may_or_may_not_have_taken_effect(seen: Value) -> None:
    history = ticking()
    write(history, 1, 0, "a")
    history.info(history.invoke(1, "write", block=0, value="b"))
    read(history, 2, 0, seen)
    read(history, 2, 0, seen, final=True)

    assert check(history).valid


def test_an_info_write_may_take_effect_long_after_its_timeout() -> None:
    history = ticking()
    history.info(history.invoke(1, "write", block=0, value="b"))
    write(history, 1, 0, "a")
    read(history, 2, 0, "a")
    read(history, 2, 0, "b")

    assert check(history).valid


def test_an_info_write_once_seen_cannot_be_unseen() -> None:
    history = ticking()
    write(history, 1, 0, "a")
    history.info(history.invoke(1, "write", block=0, value="b"))
    read(history, 2, 0, "b")
    read(history, 2, 0, "a")

    assert check(history).rules == {Rule.LINEARIZABILITY}


@pytest.mark.parametrize("seen", [INITIAL, "a"])
def test_a_write_never_completed_counts_as_info(seen: Value) -> None:
    history = ticking()
    history.invoke(1, "write", block=0, value="a")
    read(history, 2, 0, seen)

    assert check(history).valid


def test_two_nodes_acknowledging_overlapping_writes_is_reported() -> None:
    history = ticking()
    a = history.invoke(1, "write", block=0, value="a", node="n1")
    b = history.invoke(2, "write", block=1, value="b", node="n2")
    a = history.ok(a)
    b = history.ok(b)

    (violation,) = check(history).violations

    assert (violation.rule, violation.block, violation.ops) == (Rule.TWO_WRITERS, None, (a, b))
    assert violation.detail.endswith("1 ns at once")


def test_nodes_acknowledging_writes_one_after_another_are_not_two_writers() -> None:
    history = ticking()
    write(history, 1, 0, "a", node="n1")
    write(history, 1, 0, "b", node="n2")
    write(history, 2, 1, "c", node="n1", volume="other")

    assert check(history).valid


def test_recorded_accepting_intervals_of_two_nodes_must_not_overlap() -> None:
    history = ticking()
    history.accepting("n1", "volume", 0, 10)
    history.accepting("n2", "volume", 5, 20)
    history.accepting("n3", "other", 5, 20)

    (violation,) = check(history).violations

    assert (violation.rule, violation.volume, violation.ops) == (Rule.TWO_WRITERS, "volume", ())
    assert violation.detail.endswith("5 ns at once")


def test_accepting_intervals_derive_from_writes_acknowledged_by_a_known_node() -> None:
    history = ticking()
    acknowledged = write(history, 1, 0, "a", node="n1")
    write(history, 1, 0, "b")
    history.fail(history.invoke(1, "write", block=0, value="c", node="n1"))
    history.info(history.invoke(1, "write", block=0, value="d", node="n1"))

    (interval,) = accepting_from_writes(history.operations())

    assert (interval.node, interval.volume, interval.start_ns, interval.end_ns) == (
        "n1",
        "volume",
        1,
        2,
    )
    assert interval.op == acknowledged


@dataclass
class InFlight:
    op: Operation
    seen: Value | None = None
    applied: bool = False


def overwritten_value(history: History) -> Value:
    """The value of a write a later write completed over, both done by now."""
    done = [op for op in history.operations() if op.kind is Kind.WRITE and op.status is Status.OK]
    return next(a.value for a in done if any(a.precedes(b) for b in done))


def simulated_register(stale_read: int | None = None) -> History:
    """300 operations of 8 processes on one block of a correct register, each taking effect
    at a random instant between its invocation and completion; read number ``stale_read``
    instead returns a value overwritten before it was invoked."""
    rng = random.Random(7)
    history = ticking()
    register: Value = INITIAL
    running: dict[int, InFlight] = {}
    invoked = reads = 0
    while invoked < 300 or running:
        process = rng.choice([p for p in range(8) if p in running or invoked < 300])
        flight = running.get(process)
        if flight is None:
            invoked += 1
            if rng.random() < 0.5:
                op = history.invoke(process, "write", block=0, value=invoked)
                running[process] = InFlight(op)
            else:
                reads += 1
                stale = overwritten_value(history) if reads == stale_read else None
                running[process] = InFlight(history.invoke(process, "read", block=0), stale)
        elif not flight.applied:
            if flight.op.kind is Kind.WRITE:
                register = flight.op.value
            elif flight.seen is None:
                flight.seen = register
            flight.applied = True
        else:
            history.ok(flight.op, value=flight.seen)
            del running[process]
    return history


def test_300_operations_of_8_processes_on_a_correct_register_are_linearizable() -> None:
    history = simulated_register()

    assert len(history.operations()) == 300
    assert check(history).valid


def test_one_stale_read_among_300_operations_is_not_linearizable() -> None:
    assert check(simulated_register(stale_read=100)).rules == {Rule.LINEARIZABILITY}


def test_unique_payloads_fill_the_block_differ_and_name_their_block() -> None:
    history = History()

    first, second = history.unique_payload(3, 4096), history.unique_payload(3, 4096)

    assert len(first) == len(second) == 4096
    assert first != second
    assert first.split(b"\n")[0].endswith(b" block 3")


def test_a_payload_too_small_for_its_name_is_refused() -> None:
    with pytest.raises(ValueError, match="at least"):
        History().unique_payload(0, 8)


def test_a_read_of_zeros_is_the_initial_value() -> None:
    assert read(ticking(), 1, 0, bytes(512)).value is INITIAL


def test_payload_bytes_read_back_are_the_value_of_their_write() -> None:
    history = ticking()
    payload = history.unique_payload(0, 512)
    write(history, 1, 0, payload)
    read(history, 2, 0, bytes(bytearray(payload)))

    assert check(history).valid


def test_an_operation_block_that_ends_completes_the_operation_ok() -> None:
    history = ticking()

    with history.operation(1, "write", block=0, value="a", node="n1"):
        pass

    (op,) = history.operations()
    assert (op.status, op.invoke_ns, op.complete_ns, op.node) == (Status.OK, 1, 2, "n1")


def test_an_operation_block_that_raises_leaves_the_outcome_unknown() -> None:
    history = ticking()

    with pytest.raises(TimeoutError), history.operation(1, "write", block=0, value="a"):
        raise TimeoutError

    assert history.operations()[0].status is Status.INFO


def refused_flush(history: History) -> None:
    """A flush its node answered with a 503: it did not happen."""
    with history.operation(1, "flush") as call:
        call.fail(node="n2")
        raise RuntimeError("503")


def test_an_operation_block_may_fail_the_operation_before_raising() -> None:
    history = ticking()

    with pytest.raises(RuntimeError):
        refused_flush(history)

    (op,) = history.operations()
    assert (op.status, op.node) == (Status.FAIL, "n2")


def test_a_read_block_completes_with_the_value_read() -> None:
    history = ticking()

    with history.operation(1, "read", block=0) as call:
        call.ok(b"\0" * 16)

    assert (call.op.status, call.op.value) == (Status.OK, INITIAL)


def test_a_read_cannot_complete_ok_without_a_value() -> None:
    history = ticking()

    with pytest.raises(ValueError, match="with a value"), history.operation(1, "read", block=0):
        pass


def test_an_operation_completes_once() -> None:
    history = ticking()
    op = history.invoke(1, "flush")
    history.ok(op)

    with pytest.raises(ValueError, match="already complete"):
        history.info(op)


def test_the_recorder_takes_operations_from_many_threads_at_once() -> None:
    history = History()

    def client(process: int) -> None:
        for i in range(200):
            history.ok(history.invoke(process, "write", block=i % 4, value=(process, i)))

    threads = [threading.Thread(target=client, args=(process,)) for process in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    operations = history.operations()
    assert [op.id for op in operations] == list(range(1, 1601))
    assert all(op.status is Status.OK for op in operations)


def test_writes_acknowledged_under_rising_epochs_are_one_writer_at_a_time_however_they_overlap() -> (
    None
):
    history = ticking()
    first = history.invoke(1, "write", block=0, value="a", node="a")
    second = history.invoke(2, "write", block=1, value="b", node="b")
    history.ok(first, epoch=1)
    history.ok(second, epoch=2)
    assert check(history).valid


def test_a_write_acknowledged_under_an_older_epoch_after_a_newer_one_is_a_stale_owner() -> None:
    history = ticking()
    newer = history.invoke(1, "write", block=0, value="b", node="b")
    history.ok(newer, epoch=2)
    stale = history.invoke(2, "write", block=1, value="a", node="a")
    history.ok(stale, epoch=1)
    verdict = check(history)
    assert verdict.rules == {Rule.TWO_WRITERS}
    assert "stale owner" in str(verdict)


def test_one_epoch_acknowledged_by_two_nodes_is_two_writers() -> None:
    history = ticking()
    for process, node, block in ((1, "a", 0), (2, "b", 1)):
        op = history.invoke(process, "write", block=block, value=node, node=node)
        history.ok(op, epoch=3)
    assert check(history).rules == {Rule.TWO_WRITERS}
