"""RFC 9457 problem details: every error response, the domain's and FastAPI's own, in one shape."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from app import errors
from app.io.status import IoStatus, status_of
from app.luks.errors import NoKeyAvailable

log = logging.getLogger("reqcrypt.api")

PROBLEM_JSON = "application/problem+json"

HTTP_STATUS: dict[IoStatus, int] = {
    IoStatus.NOT_FOUND: 404,
    IoStatus.CONFLICT: 409,
    IoStatus.INVALID: 422,
    IoStatus.MALFORMED_RANGE: 400,
    IoStatus.OUT_OF_RANGE: 416,
    IoStatus.PRECONDITION_FAILED: 412,
    IoStatus.TOO_LARGE: 413,
    IoStatus.NO_SPACE: 507,
    IoStatus.TIMEOUT: 408,
    IoStatus.IO_ERROR: 500,
    IoStatus.AGAIN: 503,
}
"""The error vocabulary (``app.io.status``) as HTTP status codes."""


def status_for(exc: errors.ReqcryptError) -> int:
    if isinstance(exc, NoKeyAvailable):  # a LUKS passphrase refused: no I/O path meets it
        return 403
    return HTTP_STATUS[status_of(exc)]


def problem(
    status: int,
    detail: str,
    *,
    instance: str | None = None,
    type_: str = "about:blank",
    title: str | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": type_,
        "title": title or HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
    }
    if instance is not None:
        body["instance"] = instance
    body.update(extra)
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def _type_uri(exc: Exception) -> str:
    name = type(exc).__name__
    slug = "".join("-" + c.lower() if c.isupper() else c for c in name).lstrip("-")
    return f"https://reqcrypt.dev/problems/{slug}"


async def _domain_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, errors.ReqcryptError)
    status = status_for(exc)
    headers: dict[str, str] = {}
    extra: dict[str, Any] = {}
    if isinstance(exc, errors.RangeNotSatisfiable):
        headers["Content-Range"] = f"bytes */{exc.size}"
    if isinstance(exc, errors.Unavailable):
        headers["Retry-After"] = str(exc.retry_after)
    if isinstance(exc, errors.RequestTimeout):
        headers["Connection"] = "close"  # the rest of the body is never read
    if isinstance(exc, errors.TableError):
        extra = {"line": exc.line, "field": exc.field}
    if isinstance(exc, errors.BatchFailed):
        extra = {"failed": exc.failed}
    if isinstance(exc, errors.Unavailable):  # a bound doing its job: retried, not a fault
        log.debug("request %s refused for now: %s", request.url.path, exc.detail)
    elif status >= 500:
        log.error("request %s failed: %s", request.url.path, exc.detail)
    return problem(
        status,
        exc.detail,
        instance=request.url.path,
        type_=_type_uri(exc),
        headers=headers,
        **extra,
    )


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(request: Request) -> str:
    """Every method some route serves at this path (Starlette names only the first route's)."""
    allowed = [
        method
        for method in _METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] is Match.FULL
            for route in request.app.routes
        )
    ]
    return ", ".join(allowed)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = allowed_methods(request)
    return problem(exc.status_code, detail, instance=request.url.path, headers=headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    # Only locations and messages: the rejected input may hold a key.
    issues = [
        {"loc": list(err.get("loc", ())), "msg": str(err.get("msg", ""))} for err in exc.errors()
    ]
    detail = "; ".join(f"{'.'.join(map(str, i['loc']))}: {i['msg']}" for i in issues)
    return problem(422, detail or "invalid request", instance=request.url.path, errors=issues)


async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
    request_id = getattr(request.state, "request_id", "-")
    log.error(
        "unhandled error on %s %s (request id %s): %s",
        request.method,
        request.url.path,
        request_id,
        type(exc).__name__,
        exc_info=exc,
    )
    # Starlette re-raises after sending this, and uvicorn then closes the connection:
    # say so, or a keep-alive client sends its next request into a closed socket.
    return problem(
        500,
        f"internal error; quote request id {request_id} when reporting it",
        instance=request.url.path,
        headers={"X-Request-ID": request_id, "Connection": "close"},
    )


async def _client_gone(request: Request, exc: Exception) -> Response:
    """The client left mid-request (a body cut short): nothing to answer, nothing wrong
    here. Its request wrote nothing it acknowledged."""
    log.debug("client left during %s %s", request.method, request.url.path)
    return Response(status_code=499)


def install(app: FastAPI) -> None:
    app.add_exception_handler(ClientDisconnect, _client_gone)
    app.add_exception_handler(errors.ReqcryptError, _domain_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _unhandled)


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries for the problem statuses a route may return."""
    return {
        status: {
            "description": HTTPStatus(status).phrase,
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for status in statuses
    }
