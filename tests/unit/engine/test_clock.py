import itertools
import threading

import pytest

from app.engine.clock import DeviceTimer, VirtualClock
from app.engine.model import DeviceModel

pytestmark = pytest.mark.usefixtures("engine_model")


class FakeTime:
    def __init__(self):
        self.now = 0
        self.slept = []

    def monotonic_ns(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += int(seconds * 1e9)


def test_work_queues_behind_busy_lane_and_reports_the_wait():
    fake = FakeTime()
    clock = VirtualClock(1, monotonic_ns=fake.monotonic_ns)
    first = clock.reserve([100.0, 100.0])
    second = clock.reserve([50.0])
    assert (first.start_ns, first.end_ns, first.wait_ns) == (0, 200, 0)
    assert (second.start_ns, second.end_ns, second.wait_ns) == (200, 250, 200)


def test_idle_time_is_not_busy_time():
    fake = FakeTime()
    clock = VirtualClock(1, monotonic_ns=fake.monotonic_ns)
    clock.reserve([100.0])
    fake.now = 1000
    late = clock.reserve([100.0])
    assert late.start_ns == 1000
    snapshot = clock.snapshot()
    assert snapshot.busy_ns == 200
    assert snapshot.span_ns == 1100
    assert snapshot.utilization_wall == 200 / 1000


def test_busy_for_is_the_wall_time_until_the_last_work_ends_backlog_included():
    fake = FakeTime()
    clock = VirtualClock(1, time_scale=2.0, monotonic_ns=fake.monotonic_ns)
    assert clock.busy_for() == 0.0
    clock.reserve([1e9])
    clock.reserve([1e9])  # queued behind the first: ends at virtual 2 s
    assert clock.busy_for() == pytest.approx(4.0)  # wall seconds at time_scale 2
    fake.now = 3 * 10**9  # virtual 1.5 s
    assert clock.busy_for() == pytest.approx(1.0)
    fake.now = 5 * 10**9
    assert clock.busy_for() == 0.0


def test_lanes_run_calls_in_parallel():
    clock = VirtualClock(2, monotonic_ns=lambda: 0)
    reservation = clock.reserve([100.0, 100.0, 100.0], ready_ns=0)
    assert reservation.end_ns == 200
    assert reservation.busy_ns == 300


def test_concurrent_reservations_never_overlap_on_one_lane():
    clock = VirtualClock(1, monotonic_ns=lambda: 0)
    results = []
    lock = threading.Lock()

    def worker():
        for _ in range(200):
            reservation = clock.reserve([10.0], ready_ns=0)
            with lock:
                results.append((reservation.start_ns, reservation.end_ns))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.sort()
    assert len(results) == 1600
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(results))
    snapshot = clock.snapshot()
    assert snapshot.busy_ns == 16000
    assert snapshot.span_ns == 16000  # the first reservation starts at 0


def test_pacing_sleeps_until_the_scaled_completion():
    fake = FakeTime()
    clock = VirtualClock(1, time_scale=0.5, monotonic_ns=fake.monotonic_ns, sleep=fake.sleep)
    reservation = clock.reserve([1e6])
    slept = clock.sleep_until(reservation.end_ns)
    assert slept == 0.5e6 / 1e9
    assert fake.now == 500_000


def test_device_timer_counts_ios_and_charges_the_model():
    timer = DeviceTimer(DeviceModel(name="d", write_latency_ns=1000.0, write_bytes_per_s=1e9))
    reservation = timer.account("write", 4096, ready_ns=0)
    assert reservation.busy_ns == 5096
    snapshot = timer.snapshot()
    assert snapshot["ios"]["write"] == 1
    assert snapshot["bytes"]["write"] == 4096


def test_device_timer_with_pacing_really_sleeps():
    model = DeviceModel(name="d", read_latency_ns=2e6)
    timer = DeviceTimer(model, pacing=0.5)
    start = timer.clock.now_ns()
    reservation = timer.account("read", 0)
    assert reservation.end_ns - start >= 2_000_000
    assert timer.clock.now_ns() >= reservation.end_ns


BUFFERED = DeviceModel(
    name="card",
    write_bytes_per_s=1e9,  # 1 ns per byte from the buffer
    write_buffer_bytes=2000,
    write_sustained_bytes_per_s=2.5e8,  # 4 ns per byte once it is full
)


def test_buffered_device_writes_at_burst_rate_until_full_then_sustained():
    fake = FakeTime()
    timer = DeviceTimer(BUFFERED, clock=VirtualClock(1, monotonic_ns=fake.monotonic_ns))
    durations = [timer.account("write", 1000).elapsed_ns for _ in range(3)]
    assert durations == [1000, 2000, 6000]  # the second waits for the first, and so on
    assert timer.snapshot()["write_bytes_by_regime"] == {"burst": 2000, "sustained": 1000}


def test_idle_time_drains_the_buffer_at_the_sustained_rate():
    fake = FakeTime()
    timer = DeviceTimer(BUFFERED, clock=VirtualClock(1, monotonic_ns=fake.monotonic_ns))
    timer.account("write", 2000)  # full, busy until 2000 ns
    fake.now = 2000 + 4000  # 4 us idle: 1000 bytes drained
    late = timer.account("write", 1500)
    assert late.elapsed_ns == 1000 + 500 * 4
    assert timer.snapshot()["write_bytes_by_regime"] == {"burst": 3000, "sustained": 500}


def test_unbuffered_device_reports_no_regime():
    timer = DeviceTimer(DeviceModel(name="d", write_bytes_per_s=1e9))
    timer.account("write", 4096)
    assert timer.snapshot()["write_bytes_by_regime"] == {"burst": 0, "sustained": 0}


def test_settle_empties_the_buffer():
    fake = FakeTime()
    timer = DeviceTimer(BUFFERED, clock=VirtualClock(1, monotonic_ns=fake.monotonic_ns))
    timer.account("write", 2000)
    timer.settle()
    timer.account("write", 1000)
    assert timer.snapshot()["write_bytes_by_regime"] == {"burst": 3000, "sustained": 0}
