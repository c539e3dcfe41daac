"""The engine interface: one request in, one result out (httpx's ``BaseTransport.handle_request``).

A caller (the crypt target) builds an ``EngineRequest`` and calls
``Engine.process``; how the bytes and the time are produced is the engine's
business (``SimulatedEngine``), or a test's (``MockEngine``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from app.engine import _model, accel
from app.engine.clock import ClockSnapshot
from app.engine.model import Capabilities, EngineProfile, SpecLike
from app.engine.planner import CallPlan, plan_calls
from app.errors import InvalidInput
from app.vocab import SECTOR_SHIFT, CipherOp, DispatchMode

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ["CryptTransformLike", "Engine", "EngineRequest", "EngineResult", "EngineStats"]


class CryptTransformLike(Protocol):
    """The part of ``app.crypto.transform.CryptTransform`` the engine calls."""

    @property
    def sector_size(self) -> int: ...
    @property
    def spec(self) -> SpecLike: ...
    def encrypt(self, data: Buffer, sector: int, /) -> bytes: ...
    def decrypt(self, data: Buffer, sector: int, /) -> bytes: ...
    def encrypt_segments(self, segments: Sequence[Buffer], sector: int, /) -> list[bytes]: ...
    def decrypt_segments(self, segments: Sequence[Buffer], sector: int, /) -> list[bytes]: ...
    def encrypt_into(self, data: Buffer, sector: int, out: Buffer, /) -> None: ...
    def decrypt_into(self, data: Buffer, sector: int, out: Buffer, /) -> None: ...


@dataclass(slots=True)
class EngineRequest:
    """Encrypt or decrypt ``segments`` starting at target-relative ``sector``.

    Not frozen, like ``EngineResult``: one of each is built per request, and a frozen
    dataclass's ``__init__`` costs three times as much.

    ``bios`` are ``(sector, nr_sectors)`` of the bios merged into the request,
    in the same frame as ``sector``; bio mode makes one bulk call per bio.
    ``None`` means the request is a single bio. ``into``, when given, receives
    the output (one buffer per segment, same sizes) instead of fresh buffers:
    reads decrypt straight into the bio pages. ``max_call_bytes`` caps one call
    below the engine's own limit: dm-crypt's split (``max_read_size`` /
    ``max_write_size``), whose pieces the engine's channels run side by side.
    """

    op: CipherOp
    transform: CryptTransformLike
    segments: Sequence[Buffer]
    sector: int
    dispatch_mode: DispatchMode
    bios: Sequence[tuple[int, int]] | None = None
    into: Sequence[memoryview] | None = None
    max_call_bytes: int | None = None

    def views(self) -> list[memoryview]:
        """The segments as byte views, checked against ``into``."""
        segments, into = self.segments, self.into
        if len(segments) == 1:  # a lone bio's page: no comprehensions
            view = segments[0]
            if not (  # a flat byte view is taken as it is: no new view and cast
                type(view) is memoryview
                and view.c_contiguous
                and view.ndim == 1
                and view.format == "B"
            ):
                view = memoryview(view).cast("B")
            if into is not None and (len(into) != 1 or len(into[0]) != view.nbytes):
                raise ValueError("output buffers must match the input segments")
            return [view]
        views = [memoryview(segment).cast("B") for segment in segments]
        if into is not None and [len(out) for out in into] != [v.nbytes for v in views]:
            raise ValueError("output buffers must match the input segments")
        return views

    def plan(self, capabilities: Capabilities, views: Sequence[memoryview]) -> CallPlan:
        """The calls, planned in C unless ``accel`` asks for the reference."""
        if self.max_call_bytes is not None:
            capabilities = capabilities.capped(self.max_call_bytes)
        return (plan_calls if accel.reference else _model.plan_calls)(
            capabilities,
            self.transform.spec,
            [views[0].nbytes] if len(views) == 1 else [view.nbytes for view in views],
            op=self.op,
            data_unit_size=self.transform.sector_size,
            dispatch_mode=self.dispatch_mode,
            sector=self.sector,
            bios=self.bios,
        )

    def outputs(self, views: Sequence[memoryview]) -> list[Buffer]:
        """``into`` (a read lands straight in the bio's pages) or fresh buffers, uninitialized:
        every byte is about to be written, zeroing would be a wasted pass."""
        if self.into is not None:
            return list(self.into)
        return [np.empty(view.nbytes, dtype=np.uint8).data for view in views]

    def convert(self, views: Sequence[memoryview], outputs: Sequence[Buffer]) -> None:
        """The bytes, segment by segment, on the crypto layer's fastest byte-identical path."""
        transform = self.transform
        convert = transform.encrypt_into if self.op == "encrypt" else transform.decrypt_into
        position = self.sector
        for view, output in zip(views, outputs, strict=True):
            convert(view, position, output)
            position += view.nbytes >> SECTOR_SHIFT


@dataclass(slots=True)
class EngineResult:
    """Outputs per input segment, the calls made, and the modelled time.

    ``modelled_ns`` is the request's own crypto time (CPU IVs + calls over the
    channels, or the measured wall time of the calls for ``software``);
    ``queue_wait_ns`` is what it waited behind other requests on the engine's
    virtual clock; ``completes_at_ns`` is its end on that clock.
    """

    outputs: list[Buffer]
    plan: CallPlan
    modelled_ns: int
    cpu_ns: int = 0
    queue_wait_ns: int = 0
    completes_at_ns: int = 0

    @property
    def calls(self) -> int:
        return len(self.plan.calls)


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Live counters of one engine since it was built."""

    name: str
    requests: int
    bulk_calls: int
    unit_calls: int
    bytes_encrypted: int
    bytes_decrypted: int
    cpu_ns: int
    clock: ClockSnapshot

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "requests": self.requests,
            "calls": {"bulk": self.bulk_calls, "unit": self.unit_calls},
            "bytes": {"encrypt": self.bytes_encrypted, "decrypt": self.bytes_decrypted},
            "cpu_ns": self.cpu_ns,
            **self.clock.to_dict(),
        }


class Engine(ABC):
    """A crypto engine: takes a request's segments, returns its ciphertext/plaintext."""

    @property
    @abstractmethod
    def profile(self) -> EngineProfile: ...

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def paced(self) -> bool:
        """Whether ``process`` sleeps out modelled time."""
        return False

    def busy_for(self) -> float:
        """Wall seconds until the work given to the engine is done by its model: a request
        started now would queue that long behind it (0: idle, or no model)."""
        return 0.0

    @abstractmethod
    def process(self, request: EngineRequest) -> EngineResult: ...

    @abstractmethod
    def snapshot(self) -> EngineStats: ...

    def check(self, spec: SpecLike, data_unit_size: int) -> None:
        """Refuse, at table load, a volume this engine could never process."""
        reason = self.profile.capabilities.unsupported_reason(spec, data_unit_size)
        if reason is not None:
            raise InvalidInput(f"engine {self.profile.name}: {reason}")
