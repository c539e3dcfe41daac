"""``create_app()``: the FastAPI application, with everything long-lived built in the lifespan."""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, cast

import anyio
import httpx
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from prometheus_client import CollectorRegistry, ProcessCollector
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from app.api import docs, manual, problems
from app.api.bodylimit import ControlBodyLimit
from app.api.connections import bounded_head_protocol
from app.api.ownership import OwnerRouting
from app.api.paths import CanonicalPath
from app.api.routes import (
    benchmarks,
    ceiling,
    data,
    devices,
    engines,
    health,
    luks,
    trace,
    volumes,
)
from app.api.schemas import Problem, TableIn
from app.bench.cells import CellRunner
from app.bench.jobs import BenchmarkJobs
from app.cluster import ClusterNode
from app.cluster.relay import CONNECT_SECONDS
from app.cluster.serving import ServingSet
from app.config import ClusterSettings, HttpLimits, Settings, get_settings
from app.control import Control
from app.db import checks, keycheck, migrate
from app.db.leases import Leases
from app.db.queries import SqlRegistryStore
from app.db.records import Records, master_key_unwraps, rewrap_keys
from app.db.session import make_engine, make_sessionmaker
from app.engine.registry import EngineRegistry
from app.io.admission import VolumeAdmission
from app.io.budget import ByteBudget
from app.io.executor import IoExecutor
from app.io.memory import trim_after
from app.keyfiles import (
    MasterKeyError,
    admin_token_path,
    commit_pending_master_key,
    key_check_value,
    load_admin_token,
    make_data_dir,
    not_the_recorded_key,
    settle_master_key,
    write_pending_master_key,
)
from app.metrics import (
    HttpMetrics,
    RequestContextMiddleware,
    ScrapeCollector,
    budget_metrics,
    cluster_metrics,
    nbd_metrics,
    volume_metrics,
)
from app.nbd.server import NbdServer, make_tls_context
from app.state import State
from app.storage.rbd import CephCluster
from app.storage.registry import DeviceRegistry

log = logging.getLogger("reqcrypt")

TAGS = ("health", "devices", "volumes", "data", "benchmarks", "engines")

DESCRIPTION = """\
Encrypted block volumes managed like Linux device-mapper `crypt` targets.

Authenticate with `Authorization: Bearer <token>`: the admin token (everything,
including `show_keys`) or the io token (data path and read-only status). When no
token is configured, an admin token is generated on first start and stored 0600
in the data directory as `admin.token`. Errors are `application/problem+json`
(RFC 9457).
"""


def forward_timeout(limits: HttpLimits, cluster: ClusterSettings) -> httpx.Timeout:
    """A forwarded control call: connecting is quick or hopeless; the answer may take a
    draining suspend (``suspend_wait_seconds``) or a move (that, then up to two leases
    for the target to take over). The owner's heartbeat ends the wait much sooner when
    the owner freezes or dies (``app.cluster.relay``): this is only the backstop for an
    owner that heartbeats yet never answers."""
    return httpx.Timeout(
        limits.suspend_wait_seconds + 2 * cluster.lease_seconds + 30,
        connect=CONNECT_SECONDS,
    )


def http_protocol(settings: Settings) -> type[asyncio.Protocol]:
    """What ``serve`` runs uvicorn with: its protocol plus a bounded request head, read
    into buffers it gives."""
    # uvicorn only instantiates the class, and the loop serves a buffered protocol as well.
    http = settings.http
    protocol = bounded_head_protocol(
        http.head_timeout_seconds,
        send_timeout=http.send_timeout_seconds,
        max_connections=http.max_connections,
    )
    return cast("type[asyncio.Protocol]", protocol)


def ceph_cluster(settings: Settings) -> CephCluster | None:
    """The cluster rbd devices live on; it connects at first use, not here."""
    if settings.ceph_conf is None:
        return None
    return CephCluster(
        settings.ceph_conf,
        client=settings.ceph_client,
        keyring=settings.ceph_keyring,
        timeout_seconds=settings.ceph_timeout_seconds,
    )


def open_master_key(settings: Settings, sessions: sessionmaker[Session]) -> bytes:
    """The master key, checked against the database's check value (recorded here by the
    first node to start) or, on a database without one, the stored keys."""
    recorded = keycheck.recorded(sessions)
    key = settle_master_key(settings, lambda key: master_key_unwraps(sessions, key), recorded)
    if recorded is None:
        value = key_check_value(key)
        if keycheck.record(sessions, value) != value:  # another node's first start won
            raise not_the_recorded_key(settings)
    return key


def migrated_engine(settings: Settings) -> Engine:
    """The database engine once the server and schema are checked (``checks.DatabaseRefused``
    if not usable) and, unless ``migrate_on_start`` is off, migrated to head. Off, a
    database behind the code is served as it is and ``/readyz`` answers 503."""
    make_data_dir(settings)
    url = settings.resolved_database_url
    checks.check_server(url)
    db_engine = make_engine(url)
    try:
        checks.check_revision(db_engine, url)
        if settings.migrate_on_start:
            migrate.upgrade(url)
    except BaseException:
        db_engine.dispose()
        raise
    return db_engine


def check_master_key(settings: Settings) -> None:
    """``serve``'s check before it binds a port: the database is usable, migrated, and the
    key fits."""
    db_engine = migrated_engine(settings)
    try:
        open_master_key(settings, make_sessionmaker(db_engine))
    finally:
        db_engine.dispose()


def rotate_master_key(settings: Settings) -> int:
    """Re-wrap every stored key under a fresh master key; returns how many keys.

    Order for crash safety: new key durable in the side file, then one transaction
    re-wraps every row, then the rename. A crash anywhere leaves the rows all under
    one of the two keys, and ``open_master_key`` at the next start keeps that one.
    """
    if settings.master_key is not None:
        raise MasterKeyError(
            "the master key comes from REQCRYPT_MASTER_KEY: rotate it where that variable is set"
        )
    db_engine = migrated_engine(settings)
    try:
        sessions = make_sessionmaker(db_engine)
        old_key = open_master_key(settings, sessions)
        new_key = write_pending_master_key(settings)
        count = rewrap_keys(sessions, old_key, new_key, key_check_value(new_key))
        commit_pending_master_key(settings)
        return count
    finally:
        db_engine.dispose()


def build_state(settings: Settings, registry: CollectorRegistry) -> State:
    db_engine = migrated_engine(settings)
    http = settings.http
    admin_token: str | None = None
    if settings.auth == "enabled":
        admin_token, created = load_admin_token(settings)
        if created:
            log.warning("generated an admin token in %s", admin_token_path(settings))
    io_token = settings.io_token.get_secret_value() if settings.io_token else None
    sessions = make_sessionmaker(db_engine)
    try:
        master_key = open_master_key(settings, sessions)
    except BaseException:
        db_engine.dispose()
        raise
    engines = EngineRegistry(SqlRegistryStore(sessions), pacing=settings.pacing)
    engines.load()
    devices = DeviceRegistry(
        settings.devices_dir,
        ceph_cluster(settings),
        rbd_prefix=settings.rbd_image_prefix,
        rbd_aio=settings.rbd_aio,
    )
    cluster_settings = settings.cluster
    serving = None
    if cluster_settings is not None:
        leases = Leases(sessions, cluster_settings.node_id, cluster_settings.lease_seconds)
        serving = ServingSet(leases, devices)
    control = Control(Records(sessions, master_key), devices, engines, settings.control, serving)
    control.restore()
    registry.register(ScrapeCollector(partial(volume_metrics, control)))
    budget = ByteBudget(settings.buffered_bytes, drained=trim_after)
    registry.register(ScrapeCollector(partial(budget_metrics, budget)))
    cluster = None
    if cluster_settings is not None and serving is not None:
        cluster = ClusterNode(control, serving, cluster_settings)
        registry.register(ScrapeCollector(partial(cluster_metrics, cluster)))
    benchmarks_runner = BenchmarkJobs(sessions, CellRunner(control, engines), settings.benchmarks)
    benchmarks_runner.recover()
    return State(
        settings=settings,
        http=http,
        db_engine=db_engine,
        sessions=sessions,
        admin_token=admin_token,
        io_token=io_token,
        registry=registry,
        control=control,
        engines=engines,
        benchmarks=benchmarks_runner,
        io_executor=IoExecutor(),
        admission=VolumeAdmission(http.max_volume_ios),
        budget=budget,
        cluster=cluster,
    )


async def start_nbd(state: State) -> NbdServer:
    settings = state.settings.nbd
    assert settings is not None
    tls = None
    if settings.nbd_tls_cert and settings.nbd_tls_key and settings.nbd_tls_ca:
        tls = make_tls_context(
            str(settings.nbd_tls_cert), str(settings.nbd_tls_key), str(settings.nbd_tls_ca)
        )
    server = NbdServer(
        state.control, state.io_executor, state.admission, settings, budget=state.budget, tls=tls
    )
    await server.start()
    state.registry.register(ScrapeCollector(partial(nbd_metrics, server)))
    log.info("NBD on %s:%d%s", settings.host, server.port, " (TLS required)" if tls else "")
    return server


def state_bounds(schema: dict[str, Any], settings: Settings) -> None:
    """Bounds this service's settings set, stated where a client reads them: a request the
    document allows is one the service accepts."""
    device = schema["components"]["schemas"]["DeviceCreate"]["properties"]
    device["size_bytes"]["maximum"] = settings.max_device_bytes
    if settings.ceph_conf is None:
        device["store"]["enum"] = ["file"]  # rbd needs REQCRYPT_CEPH_CONF


def document_statuses(schema: dict[str, Any], problem: dict[str, Any]) -> None:
    """The statuses every operation of a kind may answer, so routes list only their own:
    401 where a token is needed, 400 and 413 (REQCRYPT_MAX_CONTROL_BODY_BYTES, checked
    before the body is read) where a body is taken, and problem+json for 422."""
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            answers = operation.setdefault("responses", {})
            statuses: list[int] = []
            if operation.get("security"):
                statuses.append(401)
            if "requestBody" in operation:
                statuses.append(400)
                if not path.endswith("/data"):
                    statuses.append(413)
            for status, answer in problems.responses(*statuses).items():
                answers.setdefault(str(status), answer)
            if any(p.get("in") == "header" for p in operation.get("parameters", [])):
                # A header the HTTP server cannot parse is refused by uvicorn itself,
                # before the service, in plain text.
                bad = answers.setdefault("400", problems.responses(400)[400])
                bad.setdefault("content", {})["text/plain"] = {"schema": {"type": "string"}}
            if "422" in answers:  # validation errors are problem+json too
                answers["422"]["content"] = {problems.PROBLEM_JSON: problem}


def install_openapi(app: FastAPI, settings: Settings) -> None:
    """Register the schemas that routes reference by hand (problem+json, text/plain tables)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
                tags=[{"name": name} for name in TAGS],
            )
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in (Problem, TableIn):
                components[model.__name__] = model.model_json_schema()
            problem = {"schema": {"$ref": "#/components/schemas/Problem"}}
            document_statuses(schema, problem)
            state_bounds(schema, settings)
            manual.apply(schema, problem)
            for unused in ("HTTPValidationError", "ValidationError"):
                components.pop(unused, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


class WithholdExceptionText(logging.Filter):
    """Log where an unexpected exception was raised, never its message.

    Built-in exceptions echo their input (``invalid literal for int(): '<key>'``), so a
    traceback's last line can carry a key; the frames (file, line, code) cannot.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is not None:
            frames = "".join(traceback.format_tb(error.__traceback__)).rstrip()
            record.msg = (
                f"{record.getMessage()}\nTraceback (most recent call last):\n{frames}\n"
                f"{type(error).__qualname__}: (message withheld: it may hold request input)"
            )
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


def withhold_exception_text() -> None:
    """Put the filter on the loggers that log exceptions: uvicorn's (a 500 that Starlette
    re-raises) and the service's own, all created at import by now."""
    names = ["uvicorn.error", "reqcrypt"]
    names += [
        name for name in logging.root.manager.loggerDict if name.startswith(("reqcrypt.", "app."))
    ]
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, WithholdExceptionText) for f in logger.filters):
            logger.addFilter(WithholdExceptionText())


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)  # process_resident_memory_bytes, CPU, open fds

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        withhold_exception_text()  # here: uvicorn has configured its loggers
        state = build_state(settings, registry)
        app.state.reqcrypt = state
        try:
            if state.cluster is not None:
                await anyio.to_thread.run_sync(state.cluster.start)
                state.forwarder = httpx.AsyncClient(
                    timeout=forward_timeout(state.http, state.cluster.settings)
                )
            if settings.nbd_port is not None:
                state.nbd = await start_nbd(state)
            yield
        finally:
            if state.nbd is not None:
                await state.nbd.close()
            if state.forwarder is not None:
                await state.forwarder.aclose()
            if state.cluster is not None:
                await anyio.to_thread.run_sync(state.cluster.stop)
            state.io_executor.shutdown()
            state.benchmarks.close()
            state.control.close()
            state.db_engine.dispose()

    app = FastAPI(
        title="reqcrypt",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        # The service exports its own Prometheus metrics and configures no OpenTelemetry
        # provider; left on, every request asks three global providers whether one is set.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    install_openapi(app, settings)
    problems.install(app)
    if settings.node_id is not None:
        app.add_middleware(OwnerRouting)
    app.add_middleware(ControlBodyLimit, max_bytes=settings.http.max_control_body_bytes)
    app.add_middleware(CanonicalPath)
    app.add_middleware(RequestContextMiddleware, metrics=HttpMetrics(registry))
    # Data routes first: FastAPI tries routers in this order on every request.
    app.include_router(data.router)
    if settings.bench_ceiling:
        app.include_router(ceiling.router)
    app.include_router(health.router)
    app.include_router(devices.router)
    app.include_router(luks.router)
    app.include_router(volumes.router)
    app.include_router(trace.router)
    app.include_router(benchmarks.router)
    app.include_router(engines.router)
    docs.install(app)
    return app
