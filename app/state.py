"""Everything long-lived, built once in the lifespan and reached through ``api/deps.py``."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from app.bench.jobs import BenchmarkJobs
from app.cluster import ClusterNode
from app.config import HttpLimits, Settings
from app.control import Control
from app.engine.registry import EngineRegistry
from app.io.admission import VolumeAdmission
from app.io.budget import ByteBudget
from app.io.executor import IoExecutor
from app.nbd.server import NbdServer


@dataclass(slots=True)
class State:
    settings: Settings
    http: HttpLimits
    """What the HTTP API bounds, read once from ``settings``."""
    db_engine: Engine
    sessions: sessionmaker[Session]
    admin_token: str | None
    io_token: str | None
    registry: CollectorRegistry
    control: Control
    engines: EngineRegistry
    benchmarks: BenchmarkJobs
    io_executor: IoExecutor
    admission: VolumeAdmission
    budget: ByteBudget
    """Bytes held for clients, HTTP and NBD together (REQCRYPT_MAX_BUFFERED_BYTES)."""
    nbd: NbdServer | None = None
    cluster: ClusterNode | None = None
    """This process as a cluster node (REQCRYPT_NODE_ID); None: the only node."""
    forwarder: httpx.AsyncClient | None = None
    """Replays control calls to the owner node (``app.api.ownership``)."""
