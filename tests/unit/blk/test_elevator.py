from app.blk import Bio, DeadlineElevator, NoneElevator, Op, Request

MS = 1_000_000


def rq(op: Op, sector: int) -> Request:
    return Request.from_bio(Bio(op, sector, 8), 65536)


def drain(elevator, now=0, ready=lambda rq: True):
    order = []
    while (picked := elevator.next_request(now, ready)) is not None:
        order.append(picked.sector)
    return order


def test_none_is_fifo_whatever_the_sector():
    elevator = NoneElevator()
    for sector in (300, 100, 200):
        elevator.insert(rq(Op.WRITE, sector), 0)
    assert drain(elevator) == [300, 100, 200]


def test_elevators_skip_requests_that_are_not_ready():
    for elevator in (NoneElevator(), DeadlineElevator()):
        blocked = rq(Op.WRITE, 100)
        elevator.insert(blocked, 0)
        elevator.insert(rq(Op.WRITE, 200), 0)
        assert drain(elevator, ready=lambda r, b=blocked: r is not b) == [200]
        assert len(elevator) == 1


def test_deadline_dispatches_in_sector_order():
    elevator = DeadlineElevator()
    for sector in (300, 100, 200):
        elevator.insert(rq(Op.WRITE, sector), 0)
    assert drain(elevator) == [100, 200, 300]


def test_deadline_serves_expired_fifo_head_first():
    def run(now_second):
        elevator = DeadlineElevator(fifo_batch=1)
        elevator.insert(rq(Op.READ, 100), 0)
        elevator.insert(rq(Op.READ, 600), 1)
        elevator.insert(rq(Op.READ, 500), 2)
        first = elevator.next_request(3, lambda r: True)
        second = elevator.next_request(now_second, lambda r: True)
        return [first.sector, second.sector]

    assert run(4) == [100, 500]  # sector order after 100
    assert run(501 * MS) == [100, 600]  # 600 is the oldest and expired


def test_deadline_reads_preferred_until_writes_starved():
    elevator = DeadlineElevator(fifo_batch=1, writes_starved=2)
    for sector in range(0, 50, 10):
        elevator.insert(rq(Op.READ, sector), 0)
    elevator.insert(rq(Op.WRITE, 1000), 0)
    assert drain(elevator, now=1) == [0, 10, 20, 1000, 30, 40]


def test_deadline_batches_up_to_fifo_batch():
    elevator = DeadlineElevator(fifo_batch=2, writes_starved=0)
    for sector in (0, 10, 20):
        elevator.insert(rq(Op.READ, sector), 0)
    elevator.insert(rq(Op.WRITE, 5), 0)
    # The read batch continues for two requests before writes get their turn.
    assert drain(elevator, now=1) == [0, 10, 5, 20]


def test_deadline_flushes_bypass_sorting():
    elevator = DeadlineElevator()
    elevator.insert(rq(Op.WRITE, 100), 0)
    flush = Request(Op.FLUSH, 0, 0, [], [], 0)
    elevator.insert(flush, 0)
    assert elevator.next_request(0, lambda r: True) is flush


def test_deadline_front_merge_resorts():
    elevator = DeadlineElevator()
    moved, other = rq(Op.WRITE, 100), rq(Op.WRITE, 50)
    elevator.insert(moved, 0)
    elevator.insert(other, 0)
    moved.sector, moved.nr_sectors = 10, 98
    elevator.front_merged(moved, 100)
    assert drain(elevator) == [10, 50]
