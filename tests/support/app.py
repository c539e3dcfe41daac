"""The app in process: test tokens, settings, the app with its lifespan, clients over ASGI."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from fastapi import FastAPI

from app.config import Settings
from app.main import create_app

ADMIN_TOKEN = "admin-token-for-tests-0123456789"
IO_TOKEN = "io-token-for-tests-0123456789abc"


def make_settings(data_dir: Path, **overrides: object) -> Settings:
    """The tests' settings: both tokens set, a short suspend wait, ``overrides`` on top."""
    fields: dict[str, object] = {
        "data_dir": data_dir,
        "admin_token": ADMIN_TOKEN,
        "io_token": IO_TOKEN,
        "suspend_wait_seconds": 2.0,
        **overrides,
    }
    return Settings(**fields)  # type: ignore[arg-type]


@asynccontextmanager
async def started(settings: Settings) -> AsyncIterator[FastAPI]:
    """The app of ``settings``, between its startup and its shutdown."""
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        yield application


@asynccontextmanager
async def asgi_client(app: FastAPI, token: str | None) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client calling ``app`` in process, with ``token`` as bearer if given."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://testserver", headers=headers
    ) as http:
        yield http


@asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its lifespan, called in process with the admin token."""
    async with started(settings) as application, asgi_client(application, ADMIN_TOKEN) as client:
        yield client
