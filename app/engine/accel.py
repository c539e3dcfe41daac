"""Which implementation runs the engine model's per-request hot path: C or the reference.

``app.engine._model`` (C) plans a request's calls, keeps a virtual clock's lanes and
counts an engine's requests; ``planner.plan_calls``, ``clock.LaneHeap`` and
``simulated.EngineCounters`` stay the readable reference, and the engine tests run
both and compare them decision for decision. The C module is built
with the package (as ``app._native`` is), so there is no silent fallback to Python.
"""

from __future__ import annotations

__all__ = ["reference", "use_reference"]

reference = False
"""True: requests are planned and clocks built by the Python reference."""


def use_reference(value: bool) -> None:
    """Run the Python reference (``True``) or the C path; clocks and engines built
    before keep theirs."""
    global reference
    reference = value
