"""``Annotated`` dependency aliases: the only way routes reach settings, sessions and state."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import Annotated, Literal

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.exceptions import HTTPException

from app.config import Settings
from app.control import Control
from app.db.session import session_scope
from app.state import State


def get_state(request: Request) -> State:
    state: State = request.app.state.reqcrypt
    return state


StateDep = Annotated[State, Depends(get_state)]


def get_settings_dep(state: StateDep) -> Settings:
    return state.settings


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


def get_session(state: StateDep) -> Iterator[Session]:
    yield from session_scope(state.sessions)


SessionDep = Annotated[Session, Depends(get_session)]

_bearer = HTTPBearer(auto_error=False, description="REQCRYPT_ADMIN_TOKEN or REQCRYPT_IO_TOKEN")

Role = Literal["admin", "io"]


def get_role(
    state: StateDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Role:
    """admin: everything; io: the data path and read-only status."""
    if state.settings.auth == "disabled":
        return "admin"
    unauthorized = HTTPException(
        401, "a bearer token is required", headers={"WWW-Authenticate": "Bearer"}
    )
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise unauthorized
    token = credentials.credentials.encode()
    if state.admin_token and hmac.compare_digest(token, state.admin_token.encode()):
        return "admin"
    if state.io_token and hmac.compare_digest(token, state.io_token.encode()):
        return "io"
    raise HTTPException(401, "invalid bearer token", headers={"WWW-Authenticate": "Bearer"})


RoleDep = Annotated[Role, Depends(get_role)]


def require_admin(role: RoleDep) -> Role:
    if role != "admin":
        raise HTTPException(403, "this operation needs the admin token")
    return role


AdminDep = Annotated[Role, Depends(require_admin)]


def get_control(state: StateDep) -> Control:
    return state.control


ControlDep = Annotated[Control, Depends(get_control)]
