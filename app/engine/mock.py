"""``MockEngine``: an engine a test scripts, as httpx's ``MockTransport`` is a transport.

The dm and blk tests use it to see exactly what a target hands the engine and
to make the engine answer as they need (fail, report calls or time), with no
cost model in the way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from app.engine.base import Engine, EngineRequest, EngineResult, EngineStats
from app.engine.clock import VirtualClock
from app.engine.model import Capabilities, CostModel, EngineProfile

__all__ = ["MOCK_PROFILE", "MockEngine"]

Handler = Callable[[EngineRequest], EngineResult]

MOCK_PROFILE = EngineProfile(
    name="mock",
    description="A test's scripted engine.",
    capabilities=Capabilities(ciphers=None, chainmodes=None),
    cost=CostModel.symmetric(setup_ns=0.0, bytes_per_s=1e12),
)


class MockEngine(Engine):
    """Answers every ``process`` with ``handler(request)`` and keeps the requests it saw.

    Without a handler it answers with ``convert``: the real bytes, the calls
    its profile plans (per data unit for ``MOCK_PROFILE``), no time.
    """

    def __init__(
        self, handler: Handler | None = None, profile: EngineProfile = MOCK_PROFILE
    ) -> None:
        self.handler = handler
        self._profile = profile
        self.requests: list[EngineRequest] = []
        self._results: list[EngineResult] = []
        self._lock = threading.Lock()
        self._clock = VirtualClock(1)

    @property
    def profile(self) -> EngineProfile:
        return self._profile

    def process(self, request: EngineRequest) -> EngineResult:
        with self._lock:
            self.requests.append(request)
        result = (self.handler or self.convert)(request)
        with self._lock:
            self._results.append(result)
        return result

    def convert(self, request: EngineRequest) -> EngineResult:
        views = request.views()
        outputs = request.outputs(views)
        request.convert(views, outputs)
        plan = request.plan(self._profile.capabilities, views)
        return EngineResult(outputs=outputs, plan=plan, modelled_ns=0)

    def snapshot(self) -> EngineStats:
        with self._lock:
            results = list(self._results)
        return EngineStats(
            name=self._profile.name,
            requests=len(results),
            bulk_calls=sum(result.plan.bulk_calls for result in results),
            unit_calls=sum(result.plan.unit_calls for result in results),
            bytes_encrypted=sum(r.plan.nbytes for r in results if r.plan.op == "encrypt"),
            bytes_decrypted=sum(r.plan.nbytes for r in results if r.plan.op == "decrypt"),
            cpu_ns=sum(result.cpu_ns for result in results),
            clock=self._clock.snapshot(),
        )
