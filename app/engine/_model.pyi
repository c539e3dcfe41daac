from collections.abc import Sequence

from app.engine.clock import Reservation
from app.engine.model import Capabilities, SpecLike
from app.engine.planner import CallPlan, EngineCall
from app.vocab import CipherOp, DispatchMode

def bind_plan(
    engine_call: type[EngineCall], call_plan: type[CallPlan], invalid_input: type[Exception], /
) -> None: ...
def plan_calls(
    capabilities: Capabilities,
    spec: SpecLike,
    segments: Sequence[int],
    *,
    op: CipherOp,
    data_unit_size: int,
    dispatch_mode: DispatchMode,
    sector: int = 0,
    bios: Sequence[tuple[int, int]] | None = None,
) -> CallPlan: ...

class Lanes:
    def __init__(self, lanes: int, reservation: type[Reservation], /) -> None: ...
    def reserve(self, durations: Sequence[float], ready_ns: int, /) -> Reservation: ...
    def totals(self) -> tuple[int, float, int, int, int | None, int]: ...

class Counters:
    def count(self, plan: CallPlan, cpu_ns: float, /) -> None: ...
    def totals(self) -> tuple[int, int, int, int, int, int]: ...
