"""SQL helpers over a sessionmaker, for callers outside a request (lifespan, control plane)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.db.models import DeviceModelRow, EngineProfileRow


class SqlRegistryStore:
    """``app.engine.registry.RegistryStore`` over the engine_profiles and device_models tables."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions

    def load_engines(self) -> Iterable[Mapping[str, Any]]:
        with self.sessions() as session:
            return [row.profile for row in session.scalars(select(EngineProfileRow))]

    def load_device_models(self) -> Iterable[Mapping[str, Any]]:
        with self.sessions() as session:
            return [row.params for row in session.scalars(select(DeviceModelRow))]

    def save_engine(self, data: Mapping[str, Any]) -> None:
        with self.sessions() as session, session.begin():
            session.add(EngineProfileRow(name=data["name"], profile=dict(data)))

    def save_device_model(self, data: Mapping[str, Any]) -> None:
        with self.sessions() as session, session.begin():
            session.add(DeviceModelRow(name=data["name"], params=dict(data)))
