"""A Jepsen-style history of block I/O against reqcrypt volumes, and the checker that judges it.

Cluster tests drive volumes from client threads while nodes are killed and leases move.
Each client records every operation here as an invocation and a completion, and
:func:`check` decides whether what the clients saw could have come from a correct,
crash-safe block device. The checker sees only what clients observed, so every rule gives
an operation with an unknown outcome the benefit of the doubt.

Model. A volume's blocks are independent registers (initial value :data:`INITIAL`, what a
never-written block reads as: zeros). Clients ``write`` a unique value to a block, ``read``
a block, and ``flush`` the volume. Each operation completes ``ok``; ``fail`` (it definitely
did not take effect, e.g. a 4xx or a 503 before anything was written); or ``info`` (unknown:
a timeout or a reset, it may take effect at any time after its invocation, or never). An
operation never completed (its client died) counts as ``info``.

Time. Every timestamp comes from one clock (``time.monotonic_ns`` unless injected).
Operation ``a`` *precedes* ``b`` when ``a`` completed ``ok`` strictly before ``b`` was
invoked; otherwise they are concurrent. An ``info`` or pending operation precedes nothing.

Durability. A flush *covers* a write when both are ``ok``, come from the same process on the
same volume, the write precedes the flush, and no crash of the volume falls between the
write's completion and the flush's (a flush in flight across a crash proves nothing about
what the crash kept). A covered write is *durable* from its first covering flush's
completion on.

Crashes. :meth:`History.crash` marks an instant when a volume may lose unflushed writes (a
node killed, a failover); it splits the volume's history into epochs. At that instant each
block's value may revert to the value of any write that has taken effect and is not known
to precede a write durable at the crash, or to :data:`INITIAL` if no write is durable yet:
flushed data survives, and so does anything newer. Operations in flight across the crash
may take effect on either side of it. A simplification: a later crash may bring back a
value an earlier one dropped, unless a durable write supersedes it (the checker does not
track what each crash dropped).

The rules (:class:`Rule`), checked by :func:`check`:

1. ``LINEARIZABILITY``: each block's reads and writes, with the volume's crashes as
   operations that set the value as above, have a linearization: an order that respects
   real time (``a`` precedes ``b`` puts ``a`` first) in which every read returns the latest
   value. ``fail`` operations are absent; ``info`` writes may sit anywhere after their
   invocation or nowhere; ``info`` reads constrain nothing.
2. ``LOST_FLUSHED_WRITE``: a read flagged ``final`` (taken after every fault healed) and
   invoked after a write became durable returns that write's value or the value of a write
   not known to precede it (one invoked after it completed, or concurrent with it).
3. ``NEVER_WRITTEN`` / ``FAILED_WRITE_READ``: a read returns :data:`INITIAL` or the value of
   a write to the same block that was not ``fail`` and was invoked before the read completed;
   returning a failed write's value is reported as ``FAILED_WRITE_READ``.
4. ``TWO_WRITERS``: no two nodes accept writes for one volume at the same instant. The
   intervals are those recorded by :meth:`History.accepting` plus, for each write acknowledged
   by a node, the write's [invocation, completion]. Those client-side intervals are
   conservative: the node accepted the write at some instant inside them, so two nodes that
   really accepted writes at one instant always overlap (no missed violation), but two slow
   requests can straddle a clean handover and overlap without one (a false alarm). Where
   the nodes name the lease epoch of each acknowledged write (``ok(..., epoch=)``), the rule
   is exact instead: an epoch belongs to one node, and no write is acknowledged under an
   older epoch after a write acknowledged under a newer one completed.

A read reported under rule 2 or 3 is left out of the linearizability search, so a fault is
reported once, under its most specific rule.
"""

from __future__ import annotations

import enum
import itertools
import math
import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Literal

DEFAULT_VOLUME = "volume"


class Initial(enum.Enum):
    """The type of :data:`INITIAL`, a value no write can produce."""

    INITIAL = "INITIAL"

    def __repr__(self) -> str:
        return "INITIAL"


INITIAL = Initial.INITIAL
"""The value of a block never written (it reads as zeros)."""

Value = Hashable
Process = int | str


class Kind(enum.StrEnum):
    WRITE = "write"
    READ = "read"
    FLUSH = "flush"


class Status(enum.StrEnum):
    """How an operation completed; ``PENDING`` ones never did and count as ``INFO``."""

    PENDING = "pending"
    OK = "ok"
    FAIL = "fail"
    INFO = "info"


class Rule(enum.StrEnum):
    """The rules of the module docstring, by the name a violation reports."""

    LINEARIZABILITY = "linearizability"
    LOST_FLUSHED_WRITE = "lost flushed write"
    NEVER_WRITTEN = "value never written"
    FAILED_WRITE_READ = "read of a failed write"
    TWO_WRITERS = "two nodes accepting writes"


def _show(value: Value | None) -> str:
    """A value short enough for a report: a payload's first line names its write."""
    if isinstance(value, bytes):
        line = value.split(b"\n", 1)[0]
        return repr(line[:48]) + ("..." if len(line) > 48 or len(line) < len(value) else "")
    return repr(value)


@dataclass(frozen=True)
class Operation:
    """One client operation: its invocation and, once known, its completion."""

    id: int
    process: Process
    kind: Kind
    volume: str
    block: int | None
    value: Value | None
    """A write's value; a read's value once it is ``ok`` (zeros read as :data:`INITIAL`)."""
    node: str | None
    final: bool
    invoke_ns: int
    status: Status = Status.PENDING
    complete_ns: int | None = None
    epoch: int | None = None
    """The lease epoch the serving node acknowledged a write under, when it says."""

    @property
    def deadline_ns(self) -> float:
        """The latest instant the operation can have taken effect: its completion when it
        is ``ok``; infinite otherwise (an ``info`` or pending one is concurrent with all
        that follows)."""
        if self.status is Status.OK and self.complete_ns is not None:
            return self.complete_ns
        return math.inf

    def precedes(self, other: Operation) -> bool:
        """Real-time order: this one completed ``ok`` before ``other`` was invoked."""
        return self.deadline_ns < other.invoke_ns

    def __str__(self) -> str:
        block = "" if self.block is None else f" block {self.block}"
        value = "" if self.value is None else f" {_show(self.value)}"
        end = "..." if self.complete_ns is None else self.complete_ns
        node = "" if self.node is None else f" on {self.node}"
        final = " (final)" if self.final else ""
        return (
            f"#{self.id} process {self.process} {self.kind}{block}{value}{final}"
            f" {self.status} [{self.invoke_ns}, {end}]{node}"
        )


@dataclass(frozen=True)
class Crash:
    """An instant after which ``volume`` may have lost its unflushed writes."""

    volume: str
    at_ns: int


@dataclass(frozen=True)
class Accepting:
    """``node`` accepted writes for ``volume`` over [start_ns, end_ns]; ``op`` is the
    acknowledged write it was derived from, if any."""

    node: str
    volume: str
    start_ns: int
    end_ns: int
    op: Operation | None = None
    epoch: int | None = None


def accepting_from_writes(operations: Iterable[Operation]) -> list[Accepting]:
    """An interval per write acknowledged by a known node: it accepted the write at some
    instant between the write's invocation and completion (rule 4 in the module docstring)."""
    return [
        Accepting(op.node, op.volume, op.invoke_ns, op.complete_ns, op, op.epoch)
        for op in operations
        if op.kind is Kind.WRITE
        and op.status is Status.OK
        and op.node is not None
        and op.complete_ns is not None
    ]


class History:
    """The operations clients invoke and complete, from any number of threads."""

    def __init__(self, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._payloads = itertools.count(1)
        self._nonce = os.urandom(4).hex()
        """Sets this history's payloads apart from any left on a volume by an earlier one."""
        self._operations: dict[int, Operation] = {}
        self._crashes: list[Crash] = []
        self._intervals: list[Accepting] = []

    def unique_payload(self, block: int, size: int) -> bytes:
        """``size`` bytes no other write of any history produces, whose first line names
        them, so a read's bytes map back to the write that produced them."""
        with self._lock:
            header = f"history {self._nonce}-{next(self._payloads)} block {block}\n".encode()
        if size < len(header):
            raise ValueError(f"a payload needs at least {len(header)} bytes, not {size}")
        return (header * (size // len(header) + 1))[:size]

    def invoke(
        self,
        process: Process,
        kind: Kind | str,
        *,
        volume: str = DEFAULT_VOLUME,
        block: int | None = None,
        value: Value | None = None,
        node: str | None = None,
        final: bool = False,
    ) -> Operation:
        """Record that ``process`` starts an operation, just before it is sent."""
        kind = Kind(kind)
        if (block is None) != (kind is Kind.FLUSH):
            raise ValueError(f"a {kind} takes a block" if block is None else "a flush has none")
        if (value is None) != (kind is not Kind.WRITE):
            raise ValueError("a write, and only a write, is invoked with a value")
        if final and kind is not Kind.READ:
            raise ValueError("only a read is final")
        with self._lock:
            op = Operation(
                next(self._ids), process, kind, volume, block, value, node, final, self._clock()
            )
            self._operations[op.id] = op
        return op

    def ok(
        self,
        op: Operation,
        *,
        value: Value | None = None,
        node: str | None = None,
        epoch: int | None = None,
    ) -> Operation:
        """The operation took effect; a read gives the value it read (zero bytes are
        :data:`INITIAL`); a write may give the lease epoch it was acknowledged under."""
        if (value is None) != (op.kind is not Kind.READ):
            raise ValueError("a read, and only a read, completes ok with a value")
        if isinstance(value, bytes) and not any(value):
            value = INITIAL
        return self._complete(op, Status.OK, value, node, epoch)

    def fail(self, op: Operation, *, node: str | None = None) -> Operation:
        """The operation definitely did not take effect."""
        return self._complete(op, Status.FAIL, None, node)

    def info(self, op: Operation, *, node: str | None = None) -> Operation:
        """Whether the operation took effect is unknown (timeout, reset)."""
        return self._complete(op, Status.INFO, None, node)

    def _complete(
        self,
        op: Operation,
        status: Status,
        value: Value | None,
        node: str | None,
        epoch: int | None = None,
    ) -> Operation:
        with self._lock:
            invoked = self._operations[op.id]
            if invoked.status is not Status.PENDING:
                raise ValueError(f"#{op.id} is already complete")
            done = replace(
                invoked,
                status=status,
                complete_ns=self._clock(),
                value=invoked.value if value is None else value,
                node=invoked.node if node is None else node,
                epoch=epoch,
            )
            self._operations[op.id] = done
        return done

    @contextmanager
    def operation(
        self,
        process: Process,
        kind: Kind | str,
        *,
        volume: str = DEFAULT_VOLUME,
        block: int | None = None,
        value: Value | None = None,
        node: str | None = None,
        final: bool = False,
    ) -> Iterator[Call]:
        """Invoke an operation for the ``with`` block. A block that ends without completing
        it completes it ``ok`` (a read must call :meth:`Call.ok` with its value); one that
        raises completes it ``info``, as a failure to hear back proves nothing (call
        :meth:`Call.fail` first when the error proves it did not happen)."""
        call = Call(
            self,
            self.invoke(
                process, kind, volume=volume, block=block, value=value, node=node, final=final
            ),
        )
        try:
            yield call
        except BaseException:
            if call.op.status is Status.PENDING:
                call.info()
            raise
        if call.op.status is Status.PENDING:
            call.ok()

    def crash(self, volume: str = DEFAULT_VOLUME) -> Crash:
        """Record that ``volume`` may lose its unflushed writes now."""
        with self._lock:
            crash = Crash(volume, self._clock())
            self._crashes.append(crash)
        return crash

    def accepting(self, node: str, volume: str, start_ns: int, end_ns: int) -> Accepting:
        """Record that ``node`` accepted writes for ``volume`` over [start_ns, end_ns]."""
        interval = Accepting(node, volume, start_ns, end_ns)
        with self._lock:
            self._intervals.append(interval)
        return interval

    def operations(self) -> list[Operation]:
        with self._lock:
            return sorted(self._operations.values(), key=lambda op: op.id)

    def crashes(self) -> list[Crash]:
        with self._lock:
            return list(self._crashes)

    def accepting_intervals(self) -> list[Accepting]:
        """The intervals recorded with :meth:`accepting` (``check`` adds derived ones)."""
        with self._lock:
            return list(self._intervals)


@dataclass
class Call:
    """An operation in flight inside :meth:`History.operation`; ``op`` is its latest record."""

    history: History
    op: Operation

    def ok(
        self, value: Value | None = None, *, node: str | None = None, epoch: int | None = None
    ) -> None:
        self.op = self.history.ok(self.op, value=value, node=node, epoch=epoch)

    def fail(self, *, node: str | None = None) -> None:
        self.op = self.history.fail(self.op, node=node)

    def info(self, *, node: str | None = None) -> None:
        self.op = self.history.info(self.op, node=node)


@dataclass(frozen=True)
class Violation:
    """A broken rule, where it broke and the operations that show it."""

    rule: Rule
    volume: str
    block: int | None
    ops: tuple[Operation, ...]
    detail: str

    def __str__(self) -> str:
        where = f"volume {self.volume!r}" + ("" if self.block is None else f" block {self.block}")
        return "\n".join(
            [f"{self.rule}: {where}: {self.detail}", *(f"    {op}" for op in self.ops)]
        )


@dataclass(frozen=True)
class Verdict:
    """What :func:`check` found in a history of ``operations`` operations."""

    violations: tuple[Violation, ...]
    operations: int

    @property
    def valid(self) -> bool:
        return not self.violations

    @property
    def rules(self) -> set[Rule]:
        return {violation.rule for violation in self.violations}

    def __str__(self) -> str:
        if self.valid:
            return f"valid: {self.operations} operations"
        head = f"invalid: {len(self.violations)} violations in {self.operations} operations"
        return "\n".join([head, *map(str, self.violations)])


def check(history: History) -> Verdict:
    """Judge ``history`` by the rules of the module docstring."""
    operations = history.operations()
    crashes: dict[str, list[Crash]] = defaultdict(list)
    for crash in history.crashes():
        crashes[crash.volume].append(crash)
    durable = _durable(operations, crashes)
    writers: dict[Value, list[Operation]] = defaultdict(list)
    registers: dict[tuple[str, int], list[Operation]] = defaultdict(list)
    for op in operations:
        if op.block is not None:
            registers[op.volume, op.block].append(op)
        if op.kind is Kind.WRITE and op.status is not Status.FAIL:
            writers[op.value].append(op)
    violations: list[Violation] = []
    for (volume, block), ops in sorted(registers.items()):
        unwritten = _unwritten_reads(volume, block, ops, writers)
        lost = _lost_flushed_writes(volume, block, ops, durable, _reads_in(unwritten))
        violations += unwritten + lost
        reported = _reads_in(unwritten + lost)
        search = _Search(_steps(ops, crashes[volume], durable, reported))
        stuck = search.run()
        if stuck is not None:
            violations.append(search.witness(volume, block, *stuck))
    violations += _overlapping_writers(
        [*history.accepting_intervals(), *accepting_from_writes(operations)]
    )
    violations += _stale_epochs(operations)
    return Verdict(tuple(violations), len(operations))


def _reads_in(violations: list[Violation]) -> set[int]:
    return {op.id for violation in violations for op in violation.ops if op.kind is Kind.READ}


def _durable(operations: list[Operation], crashes: dict[str, list[Crash]]) -> dict[int, Operation]:
    """Each write some flush covers (module docstring), to the first covering flush."""
    flushes: dict[tuple[str, Process], list[Operation]] = defaultdict(list)
    for op in operations:
        if op.kind is Kind.FLUSH and op.status is Status.OK:
            flushes[op.volume, op.process].append(op)
    durable: dict[int, Operation] = {}
    for write in operations:
        if write.kind is not Kind.WRITE or write.status is not Status.OK:
            continue
        covering = [
            flush
            for flush in flushes[write.volume, write.process]
            if write.precedes(flush)
            and not any(
                write.deadline_ns <= crash.at_ns <= flush.deadline_ns
                for crash in crashes[write.volume]
            )
        ]
        if covering:
            durable[write.id] = min(covering, key=lambda flush: flush.deadline_ns)
    return durable


def _unwritten_reads(
    volume: str, block: int, ops: list[Operation], writers: dict[Value, list[Operation]]
) -> list[Violation]:
    """Rule 3: reads of a value no write to the block could have produced by then."""
    failed: dict[Value, list[Operation]] = defaultdict(list)
    for op in ops:
        if op.kind is Kind.WRITE and op.status is Status.FAIL:
            failed[op.value].append(op)
    found: list[Violation] = []
    for read in ops:
        if read.kind is not Kind.READ or read.status is not Status.OK or read.value is INITIAL:
            continue
        sources = writers.get(read.value, [])
        here = [write for write in sources if write.block == block and write.volume == volume]
        if any(not read.precedes(write) for write in here):
            continue
        shown = _show(read.value)
        if failed[read.value]:
            found.append(
                Violation(
                    Rule.FAILED_WRITE_READ,
                    volume,
                    block,
                    (read, *failed[read.value]),
                    f"read {shown}, written only by a write that failed",
                )
            )
            continue
        if here:
            detail = f"read {shown}, written only after the read completed"
        elif sources:
            elsewhere = sorted({(write.volume, write.block) for write in sources}, key=str)
            detail = f"read {shown}, written to {elsewhere} and not to this block"
        else:
            detail = f"read {shown}, which no write wrote"
        found.append(Violation(Rule.NEVER_WRITTEN, volume, block, (read, *sources), detail))
    return found


def _lost_flushed_writes(
    volume: str, block: int, ops: list[Operation], durable: dict[int, Operation], skip: set[int]
) -> list[Violation]:
    """Rule 2: final reads that return something older than a write already durable. Only
    the latest writes lost are named: those they had overwritten are lost with them."""
    writes = [op for op in ops if op.kind is Kind.WRITE and op.status is not Status.FAIL]
    found: list[Violation] = []
    for read in ops:
        if read.kind is not Kind.READ or read.status is not Status.OK or not read.final:
            continue
        if read.id in skip:
            continue
        sources = [write for write in writes if write.value == read.value]
        lost = [
            write
            for write in writes
            if write.id in durable
            and durable[write.id].precedes(read)
            and all(source.precedes(write) for source in sources)
        ]
        for write in lost:
            if any(write.precedes(later) for later in lost):
                continue
            flush = durable[write.id]
            found.append(
                Violation(
                    Rule.LOST_FLUSHED_WRITE,
                    volume,
                    block,
                    (write, flush, read, *sources),
                    f"#{write.id} was flushed by #{flush.id}, yet final read #{read.id}"
                    f" returned {_show(read.value)}, older than it",
                )
            )
    return found


@dataclass(frozen=True)
class _Step:
    """An operation of one block's linearizability search; a crash is one too."""

    kind: Literal["write", "read", "crash"]
    invoke: int
    deadline: float
    """It takes effect by then (infinite: whenever after ``invoke``, or never)."""
    value: Value
    required: bool
    op: Operation | None = None
    crash: Crash | None = None
    reverts_to: tuple[int, ...] = ()
    """A crash's writes not known to precede a write durable at it (ids)."""
    to_initial: bool = False
    """A crash may revert the block to INITIAL: no write is durable at it."""


def _steps(
    ops: list[Operation], crashes: list[Crash], durable: dict[int, Operation], skip: set[int]
) -> list[_Step]:
    """The search's steps. When a value is written once, a read of it pins the write it
    follows: an unacknowledged write that some read returned must take effect before the
    first such read completes, and one nobody read is unobservable and dropped. A value
    written twice keeps its unacknowledged writes optional, for the general search."""
    reads = [
        op for op in ops if op.kind is Kind.READ and op.status is Status.OK and op.id not in skip
    ]
    writes = [op for op in ops if op.kind is Kind.WRITE and op.status is not Status.FAIL]
    read_by: dict[Value, float] = {}
    for read in reads:
        read_by[read.value] = min(read_by.get(read.value, math.inf), read.deadline_ns)
    copies = Counter(write.value for write in writes)
    steps = [
        _Step("read", read.invoke_ns, read.deadline_ns, read.value, True, read) for read in reads
    ]
    for write in writes:
        if write.status is Status.OK:
            deadline, required = write.deadline_ns, True
        elif copies[write.value] > 1:
            deadline, required = math.inf, False
        elif write.value in read_by:
            deadline, required = read_by[write.value], True
        else:
            continue
        steps.append(_Step("write", write.invoke_ns, deadline, write.value, required, write))
    for crash in crashes:
        kept = [w for w in writes if w.id in durable and durable[w.id].deadline_ns < crash.at_ns]
        reverts_to = tuple(w.id for w in writes if not any(w.precedes(d) for d in kept))
        steps.append(
            _Step(
                "crash",
                crash.at_ns,
                crash.at_ns,
                INITIAL,
                required=True,
                crash=crash,
                reverts_to=reverts_to,
                to_initial=not kept,
            )
        )
    return steps


class _Search:
    """Wing & Gong's search for a linearization of one block, depth first over states
    (steps placed, value) memoized as in Lowe's just-in-time linearization. A state's next
    step may be any unplaced step invoked no later than the earliest deadline among the
    required unplaced ones; the block is linearizable when a state places every required one.

    Two prunings keep a few hundred concurrent operations fast. A read that may go next and
    returns the current value is placed at once without branching: moving it to the front
    of any linearization that works keeps it working. And a step that overwrites a value some
    unplaced read returns, when no unplaced write or crash can bring it back, is a dead end.
    """

    def __init__(self, steps: list[_Step]) -> None:
        self.steps = sorted(steps, key=lambda step: (step.invoke, step.deadline))
        self.required = 0
        self.crashes = 0
        self.reads_of: dict[Value, int] = defaultdict(int)
        self.writes_of: dict[Value, int] = defaultdict(int)
        index = {step.op.id: i for i, step in enumerate(self.steps) if step.op is not None}
        self.reverts_to: dict[int, tuple[int, ...]] = {}
        for i, step in enumerate(self.steps):
            bit = 1 << i
            self.required |= bit if step.required else 0
            if step.kind == "read":
                self.reads_of[step.value] |= bit
            elif step.kind == "write":
                self.writes_of[step.value] |= bit
            else:
                self.crashes |= bit
                self.reverts_to[i] = tuple(index[op] for op in step.reverts_to if op in index)
        self.by_deadline = sorted(
            (i for i, step in enumerate(self.steps) if step.required),
            key=lambda i: self.steps[i].deadline,
        )

    def run(self) -> tuple[int, Value] | None:
        """None when the block is linearizable, else the deepest state reached."""
        seen: set[tuple[int, Value]] = set()
        deepest: tuple[int, Value] = (0, INITIAL)
        depth = -1
        stack: list[tuple[int, Value]] = [(0, INITIAL)]
        while stack:
            placed, value = stack.pop()
            placed = self._absorb(placed, value)
            if (placed, value) in seen:
                continue
            seen.add((placed, value))
            if placed & self.required == self.required:
                return None
            if (placed & self.required).bit_count() > depth:
                deepest, depth = (placed, value), (placed & self.required).bit_count()
            stack.extend(reversed(self._successors(placed, value)))
        return deepest

    def _blocker(self, placed: int) -> int | None:
        """The unplaced required step with the earliest deadline."""
        return next((i for i in self.by_deadline if not placed >> i & 1), None)

    def _frontier(self, placed: int) -> list[int]:
        """The unplaced steps that may go next."""
        blocker = self._blocker(placed)
        bound = math.inf if blocker is None else self.steps[blocker].deadline
        frontier = []
        for i in range((~placed & (placed + 1)).bit_length() - 1, len(self.steps)):
            if self.steps[i].invoke > bound:
                break
            if not placed >> i & 1:
                frontier.append(i)
        return frontier

    def _absorb(self, placed: int, value: Value) -> int:
        """Place, without branching, every read of ``value`` that may go next."""
        while True:
            grown = placed
            for i in self._frontier(placed):
                if self.steps[i].kind == "read" and self.steps[i].value == value:
                    grown |= 1 << i
            if grown == placed:
                return placed
            placed = grown

    def _successors(self, placed: int, value: Value) -> list[tuple[int, Value]]:
        successors = []
        for i in self._frontier(placed):
            step = self.steps[i]
            if step.kind == "write":
                values = [step.value]
            elif step.kind == "crash":
                values = self._reverts(i, placed)
            else:
                continue
            after = placed | 1 << i
            successors += [(after, new) for new in values if not self._dead(after, value, new)]
        return successors

    def _reverts(self, crash: int, placed: int) -> list[Value]:
        """The values a crash may leave: writes placed and not superseded by a durable one."""
        values = [self.steps[i].value for i in self.reverts_to[crash] if placed >> i & 1]
        if self.steps[crash].to_initial:
            values.append(INITIAL)
        return list(dict.fromkeys(values))

    def _dead(self, placed: int, old: Value, new: Value) -> bool:
        return (
            new != old
            and self.reads_of[old] & ~placed != 0
            and self.writes_of[old] & ~placed == 0
            and self.crashes & ~placed == 0
        )

    def witness(self, volume: str, block: int, placed: int, value: Value) -> Violation:
        """The deepest state reached, as a story: the write that left its value and the reads
        still to return it; then either the writes that overwrite it before those reads are
        invoked (a stale read), or the steps that may come next, none of which fits."""
        writer = max(
            (
                i
                for i, step in enumerate(self.steps)
                if placed >> i & 1 and step.kind == "write" and step.value == value
            ),
            default=None,
        )
        waiting = [i for i in range(len(self.steps)) if (self.reads_of[value] & ~placed) >> i & 1]
        frontier = self._frontier(placed)
        overwriters = [
            i
            for i in frontier
            if self.steps[i].kind == "write"
            and self.crashes & ~placed == 0
            and any(self.steps[i].deadline < self.steps[read].invoke for read in waiting)
        ]
        leaving = _show(value) + ("" if writer is None else f" (written by {self._name(writer)})")
        if overwriters:
            detail = (
                f"{self._names(waiting)} {'returns' if len(waiting) == 1 else 'return'}"
                f" {leaving}, which {self._names(overwriters)} overwrote before"
                f" {'it was' if len(waiting) == 1 else 'they were'} invoked"
            )
            involved = sorted({*overwriters, *waiting, *([] if writer is None else [writer])})
        else:
            blocker = self._blocker(placed)
            detail = (
                f"at best {(placed & self.required).bit_count()} of"
                f" {self.required.bit_count()} operations take effect in a valid order, leaving"
                f" {leaving}"
                + (f", still to be read by {self._names(waiting)}" if waiting else "")
                + f"; next must come one of {self._names(frontier)}"
                + ("" if blocker is None else f" (before {self._name(blocker)} completes)")
                + ", and none fits"
            )
            involved = sorted({*frontier, *waiting, *([] if writer is None else [writer])})
        ops = tuple(op for op in (self.steps[i].op for i in involved) if op is not None)
        return Violation(Rule.LINEARIZABILITY, volume, block, ops, detail)

    def _names(self, steps: list[int]) -> str:
        return ", ".join(map(self._name, steps))

    def _name(self, i: int) -> str:
        step = self.steps[i]
        if step.op is not None:
            return f"#{step.op.id}"
        assert step.crash is not None
        return f"the crash at {step.crash.at_ns}"


def _overlapping_writers(intervals: list[Accepting]) -> list[Violation]:
    """Rule 4: pairs of different nodes' intervals on one volume that overlap."""
    by_volume: dict[str, list[Accepting]] = defaultdict(list)
    for interval in set(intervals):
        by_volume[interval.volume].append(interval)
    found: list[Violation] = []
    for volume, spans in sorted(by_volume.items()):
        spans.sort(key=lambda a: (a.start_ns, a.end_ns, a.node, a.op.id if a.op else 0))
        active: list[Accepting] = []
        for span in spans:
            active = [a for a in active if a.end_ns > span.start_ns]
            for a in active:
                if a.node == span.node or (a.epoch is not None and span.epoch is not None):
                    continue  # both epochs known: ``_stale_epochs`` judges them exactly
                overlap = min(a.end_ns, span.end_ns) - span.start_ns
                found.append(
                    Violation(
                        Rule.TWO_WRITERS,
                        volume,
                        None,
                        tuple(op for op in (a.op, span.op) if op is not None),
                        f"{a.node} accepted writes over [{a.start_ns}, {a.end_ns}] and"
                        f" {span.node} over [{span.start_ns}, {span.end_ns}]:"
                        f" {overlap} ns at once",
                    )
                )
            active.append(span)
    return found


def _stale_epochs(operations: list[Operation]) -> list[Violation]:
    """Rule 4 where nodes name the lease epoch of each acknowledged write: one epoch is one
    node's, and a write acknowledged under an older epoch after one under a newer epoch
    completed (real time) is a stale owner writing after the takeover."""
    acked = [
        op
        for op in operations
        if op.kind is Kind.WRITE and op.status is Status.OK and op.epoch is not None
    ]
    found: list[Violation] = []
    owners: dict[tuple[str, int], Operation] = {}
    for op in acked:
        first = owners.setdefault((op.volume, op.epoch or 0), op)
        if first.node != op.node:
            found.append(
                Violation(
                    Rule.TWO_WRITERS,
                    op.volume,
                    None,
                    (first, op),
                    f"epoch {op.epoch} acknowledged by {first.node} and by {op.node}",
                )
            )
    by_completion = sorted(acked, key=lambda op: op.deadline_ns)
    newest: dict[str, Operation] = {}
    done = 0
    for op in sorted(acked, key=lambda op: op.invoke_ns):
        while done < len(by_completion) and by_completion[done].precedes(op):
            earlier = by_completion[done]
            seen = newest.get(earlier.volume)
            if seen is None or (seen.epoch or 0) < (earlier.epoch or 0):
                newest[earlier.volume] = earlier
            done += 1
        seen = newest.get(op.volume)
        if seen is not None and (op.epoch or 0) < (seen.epoch or 0):
            found.append(
                Violation(
                    Rule.TWO_WRITERS,
                    op.volume,
                    None,
                    (seen, op),
                    f"{op.node} acknowledged a write under epoch {op.epoch} after {seen.node}"
                    f" had under epoch {seen.epoch}: a stale owner wrote after the takeover",
                )
            )
    return found
