"""The block layer's wait primitives: a completion and a wait queue."""

from __future__ import annotations

import threading
import time

from app.blk.wait import Completion, WaitQueue


def test_completion_wakes_every_waiter_once_set():
    completion = Completion()
    woken = []
    waiters = [threading.Thread(target=lambda: woken.append(completion.wait(5))) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    completion.set()
    completion.set()  # a second set changes nothing
    for waiter in waiters:
        waiter.join()
    assert woken == [True, True, True]
    assert completion.is_set()
    assert completion.wait(0)


def test_completion_wait_times_out_while_not_set():
    completion = Completion()
    assert not completion.wait(0)
    assert not completion.wait(0.01)
    assert not completion.is_set()


def test_wait_queue_wakes_a_sleeper_on_notify_all():
    queue = WaitQueue()
    ready = threading.Event()
    woken = []

    def sleeper() -> None:
        with queue:
            ready.set()
            woken.append(queue.wait(5))

    thread = threading.Thread(target=sleeper)
    thread.start()
    ready.wait(5)
    with queue:  # the sleeper holds the lock until it waits
        queue.notify_all()
    thread.join()
    assert woken == [True]


def test_wait_queue_times_out_like_a_condition():
    queue = WaitQueue()
    began = time.monotonic()
    with queue:
        assert not queue.wait(0.01)
    assert time.monotonic() - began >= 0.01
