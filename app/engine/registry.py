"""The engines and device models a running service knows, and their live instances.

Presets come from code; custom ones arrive from the API as ``EngineProfile`` /
``DeviceModel`` and are persisted through a ``RegistryStore`` the caller
provides (an ``app.db`` adapter: this package must not import SQL). One live
``SimulatedEngine`` per profile name is shared by every volume naming it, so
volumes contend on one virtual clock as they would on one chip.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar, runtime_checkable

from app.engine.clock import DeviceTimer
from app.engine.model import DeviceModel, EngineProfile
from app.engine.presets import DEVICE_MODELS, ENGINES
from app.engine.simulated import SimulatedEngine
from app.errors import (
    AlreadyExists,
    DeviceModelNotFound,
    EngineNotFound,
    InvalidInput,
    ReqcryptError,
)

__all__ = ["EngineRegistry", "RegistryStore"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


@runtime_checkable
class RegistryStore(Protocol):
    """Persistence of custom profiles as ``to_dict()`` JSON (e.g. the engine_profiles table)."""

    def load_engines(self) -> Iterable[Mapping[str, Any]]: ...
    def load_device_models(self) -> Iterable[Mapping[str, Any]]: ...
    def save_engine(self, data: Mapping[str, Any]) -> None: ...
    def save_device_model(self, data: Mapping[str, Any]) -> None: ...


class EngineRegistry:
    """Profiles and device models by name; ``engine(name)`` / ``device_timer(name)`` are live.

    ``load()`` reads the store's custom entries (call it once at startup). A
    ``store`` that is not a ``RegistryStore`` is ignored with a warning and
    custom entries then live in memory only.
    """

    def __init__(
        self,
        store: object | None = None,
        *,
        pacing: float | None = None,
        presets: bool = True,
    ) -> None:
        if store is not None and not isinstance(store, RegistryStore):
            log.warning(
                "EngineRegistry: %r is not a RegistryStore; custom engines not persisted", store
            )
            store = None
        self.store: RegistryStore | None = store
        self.pacing = pacing
        self._lock = threading.Lock()
        self._profiles: dict[str, EngineProfile] = dict(ENGINES) if presets else {}
        self._devices: dict[str, DeviceModel] = dict(DEVICE_MODELS) if presets else {}
        self._engines: dict[str, SimulatedEngine] = {}
        self._timers: dict[str, DeviceTimer] = {}

    def load(self) -> None:
        """Register the store's custom engines and device models (validated on the way in)."""
        if self.store is None:
            return
        for data in self.store.load_engines():
            self._insert_profile(EngineProfile.from_dict(data))
        for data in self.store.load_device_models():
            self._insert_device_model(DeviceModel.from_dict(data))

    def profiles(self) -> list[EngineProfile]:
        return self._sorted(self._profiles)

    def device_models(self) -> list[DeviceModel]:
        return self._sorted(self._devices)

    def profile(self, name: str) -> EngineProfile:
        return self._named(self._profiles, name, EngineNotFound, "engine")

    def device_model(self, name: str) -> DeviceModel:
        return self._named(self._devices, name, DeviceModelNotFound, "device model")

    def add_profile(self, profile: EngineProfile) -> None:
        """Register and persist a custom engine; custom engines are modelled, never measured."""
        self._insert_profile(profile)
        if self.store is not None:
            self.store.save_engine(profile.to_dict())

    def add_device_model(self, model: DeviceModel) -> None:
        self._insert_device_model(model)
        if self.store is not None:
            self.store.save_device_model(model.to_dict())

    def _insert_profile(self, profile: EngineProfile) -> None:
        profile.validate()
        if profile.measured:
            raise InvalidInput("custom engines are modelled: measured must be false")
        self._insert(self._profiles, profile.name, profile, "engine")

    def _insert_device_model(self, model: DeviceModel) -> None:
        model.validate()
        self._insert(self._devices, model.name, model, "device model")

    def engine(self, name: str) -> SimulatedEngine:
        """The live engine of profile ``name``, built on first use."""
        profile = self.profile(name)
        return self._live(self._engines, name, lambda: SimulatedEngine(profile, pacing=self.pacing))

    def device_timer(self, name: str) -> DeviceTimer:
        """The live virtual clock of device model ``name`` (shared by devices of that model)."""
        model = self.device_model(name)
        return self._live(self._timers, name, lambda: DeviceTimer(model, pacing=self.pacing))

    def _sorted(self, table: dict[str, _T]) -> list[_T]:
        with self._lock:
            return [table[name] for name in sorted(table)]

    def _named(
        self, table: dict[str, _T], name: str, missing: type[ReqcryptError], kind: str
    ) -> _T:
        with self._lock:
            try:
                return table[name]
            except KeyError:
                raise missing(f"{kind} {name!r} does not exist") from None

    def _insert(self, table: dict[str, _T], name: str, item: _T, kind: str) -> None:
        with self._lock:
            if name in table:
                raise AlreadyExists(f"{kind} {name!r} already exists")
            table[name] = item

    def _live(self, table: dict[str, _T], name: str, build: Callable[[], _T]) -> _T:
        """``table[name]``, built by ``build`` under the lock on first use."""
        with self._lock:
            live = table.get(name)
            if live is None:
                live = table[name] = build()
            return live

    def snapshot(self) -> dict[str, Any]:
        """Live stats of every engine and device clock built so far."""
        with self._lock:
            engines, timers = dict(self._engines), dict(self._timers)
        return {
            "engines": {name: engine.snapshot().to_dict() for name, engine in engines.items()},
            "device_models": {name: timer.snapshot() for name, timer in timers.items()},
        }
