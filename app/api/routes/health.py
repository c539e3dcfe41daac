"""Liveness, readiness and Prometheus exposition: no auth (probes and scrapers have no
token), except ``/metrics`` under ``REQCRYPT_METRICS_AUTH=io``."""

from __future__ import annotations

import os
import tempfile

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from app.api.deps import StateDep, authorize
from app.api.problems import problem, responses
from app.db import migrate
from app.errors import ReqcryptError

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", response_model=None)
def readyz(state: StateDep) -> dict[str, object] | Response:
    checks: dict[str, str] = {}
    try:
        with state.db_engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        checks["database"] = "ok"
        url = state.settings.resolved_database_url
        checks["migrations"] = "ok" if migrate.at_head(state.db_engine, url) else "not at head"
    except Exception as exc:
        checks["database"] = f"unreachable: {type(exc).__name__}"
    if state.cluster is not None:
        age = state.cluster.heartbeat_age()
        if age is None or age > state.cluster.settings.lease_seconds:
            checks["node"] = "no heartbeat within a lease: this node serves no volume"
        elif not state.cluster.announced_ready:
            checks["node"] = (
                "Ceph client blocklisted, reconnecting: no RBD volume, no placement here"
            )
        else:
            checks["node"] = "ok"
    try:
        with tempfile.NamedTemporaryFile(dir=state.settings.data_dir):
            pass
        checks["data_dir"] = "ok" if os.access(state.settings.data_dir, os.W_OK) else "read-only"
    except OSError as exc:
        checks["data_dir"] = f"not writable: {exc.strerror}"
    ceph = state.control.devices.ceph
    if ceph is not None:
        try:
            ceph.ping()
            checks["ceph"] = "ok"
        except ReqcryptError as exc:
            checks["ceph"] = exc.detail
    failing = {name: value for name, value in checks.items() if value != "ok"}
    if failing:
        detail = "; ".join(f"{name}: {value}" for name, value in failing.items())
        return problem(503, f"not ready: {detail}", instance="/readyz", checks=checks)
    return {"status": "ready", "checks": checks}


async def metrics_reader(request: Request, state: StateDep) -> None:
    """Under ``REQCRYPT_METRICS_AUTH=io``, the io or admin token: the labels name every
    volume, node and engine, which not everyone who reaches the port may see."""
    if state.settings.metrics_auth == "io":
        authorize(state, request.headers.get("authorization"))


METRICS_SECURITY: dict[str, object] = {"security": [{}, {"HTTPBearer": []}]}
"""No token, or a bearer token: which one this service wants is ``REQCRYPT_METRICS_AUTH``'s."""


@router.get(
    "/metrics",
    response_class=Response,
    dependencies=[Depends(metrics_reader)],
    responses={
        401: {
            **responses(401)[401],
            "description": "REQCRYPT_METRICS_AUTH=io and no valid io or admin token",
        }
    },
    openapi_extra=METRICS_SECURITY,
)
def metrics(state: StateDep) -> Response:
    """No token needed unless `REQCRYPT_METRICS_AUTH=io`: then the io or the admin token
    (401 without). The labels name every volume, cluster node and engine."""
    return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)
