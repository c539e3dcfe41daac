"""``Annotated`` dependency aliases: the only way routes reach state, control and auth.

No route opens an SQL session itself: the control plane and the benchmark runner
own their transactions (docs/decisions/0003).

The non-blocking dependencies are ``async def``: FastAPI runs a sync dependency in
its thread pool, and four thread hops per data request cost more than the I/O.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException
from starlette.types import Scope

from app.config import HttpLimits
from app.control import Control
from app.io.admission import VolumeAdmission
from app.io.budget import ByteBudget
from app.io.executor import IoExecutor
from app.state import State


async def get_state(request: Request) -> State:
    state: State = request.app.state.reqcrypt
    return state


StateDep = Annotated[State, Depends(get_state)]


_bearer = HTTPBearer(auto_error=False, description="REQCRYPT_ADMIN_TOKEN or REQCRYPT_IO_TOKEN")

Role = Literal["admin", "io"]


def authorize(state: State, authorization: str | None) -> Role:
    """admin: everything; io: the data path and read-only status."""
    if state.settings.auth == "disabled":
        return "admin"
    scheme, _, credentials = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        raise HTTPException(
            401, "a bearer token is required", headers={"WWW-Authenticate": "Bearer"}
        )
    token = credentials.strip().encode()
    if state.admin_token and hmac.compare_digest(token, state.admin_token.encode()):
        return "admin"
    if state.io_token and hmac.compare_digest(token, state.io_token.encode()):
        return "io"
    raise HTTPException(401, "invalid bearer token", headers={"WWW-Authenticate": "Bearer"})


def authorize_scope(state: State, scope: Scope) -> Role:
    """``authorize`` from an ASGI scope's headers: for middleware, before any route runs."""
    header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
    return authorize(state, header.decode("latin-1") if header is not None else None)


async def get_role(
    request: Request,
    state: StateDep,
    _: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Role:
    return authorize(state, request.headers.get("authorization"))


RoleDep = Annotated[Role, Depends(get_role)]


def admin_only(what: str) -> HTTPException:
    """403 for the io token: says which token (scope) the operation needs (RFC 6750 §3.1)."""
    return HTTPException(
        403,
        f"{what} needs the admin token (scope 'admin'); the io token covers only "
        "the data path and read-only status",
        headers={"WWW-Authenticate": 'Bearer error="insufficient_scope", scope="admin"'},
    )


async def require_admin(role: RoleDep) -> Role:
    if role != "admin":
        raise admin_only("this operation")
    return role


AdminDep = Annotated[Role, Depends(require_admin)]


async def get_control(state: StateDep) -> Control:
    return state.control


ControlDep = Annotated[Control, Depends(get_control)]


@dataclass(frozen=True, slots=True)
class IoContext:
    control: Control
    limits: HttpLimits
    executor: IoExecutor
    admission: VolumeAdmission
    budget: ByteBudget
    role: Role


async def get_io_context(request: Request) -> IoContext:
    """Everything a data route needs in one dependency: each FastAPI dependency costs
    tens of microseconds, which a 4 KiB I/O notices."""
    state: State = request.app.state.reqcrypt
    role = authorize(state, request.headers.get("authorization"))
    return IoContext(
        state.control, state.http, state.io_executor, state.admission, state.budget, role
    )


IoDep = Annotated[IoContext, Depends(get_io_context)]

BEARER_SECURITY: dict[str, object] = {"security": [{"HTTPBearer": []}]}
"""OpenAPI security of routes that authenticate through ``IoDep`` rather than ``RoleDep``."""
