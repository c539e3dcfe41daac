"""The uvicorn and httptools internals ``app/api/connections.py`` leans on, one by one: a
release that changes one of them fails here, naming itself, before a behaviour test fails
somewhere less clear. pyproject.toml bounds both to the releases checked."""

from __future__ import annotations

import asyncio
import importlib
from importlib.metadata import version
from typing import Any

import httptools
import pytest
import uvicorn
from uvicorn.server import ServerState

from tests.support.transport import Transport

RELEASES = f"uvicorn {version('uvicorn')} with httptools {version('httptools')}"

HOOKS = (
    "connection_made",
    "connection_lost",
    "data_received",
    "eof_received",
    "pause_writing",
    "resume_writing",
    "on_headers_complete",
    "on_body",
    "on_message_complete",
    "on_response_complete",
    "_unset_keepalive_if_required",
)
"""The protocol's methods ``BoundedHeadProtocol`` overrides or calls."""


def changed(what: str) -> str:
    return (
        f"{RELEASES}: {what}. app/api/connections.py leans on it: adapt it, then move the "
        "bound in pyproject.toml"
    )


def test_uvicorn_still_has_the_modules_and_names_connections_imports() -> None:
    names = {
        "uvicorn.protocols.http.httptools_impl": ("HttpToolsProtocol", "RequestResponseCycle"),
        "uvicorn.protocols.http.flow_control": ("HIGH_WATER_LIMIT",),
    }
    for module_name, wanted in names.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            pytest.fail(changed(f"{module_name} is gone"))
        missing = [name for name in wanted if not hasattr(module, name)]
        assert not missing, changed(f"{module_name} has no {', '.join(missing)}")


def test_uvicorns_httptools_protocol_still_has_the_hooks_connections_overrides() -> None:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    missing = [name for name in HOOKS if not callable(getattr(HttpToolsProtocol, name, None))]
    assert not missing, changed(f"HttpToolsProtocol has no {', '.join(missing)}")


def test_a_request_through_uvicorns_protocol_keeps_the_state_connections_reads() -> None:
    """A plain uvicorn protocol, not ours, through one request with a body: the attributes
    ``BodySink`` and ``BoundedHeadProtocol`` read, at the moments they read them."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    seen: dict[str, Any] = {}

    class Recording(HttpToolsProtocol):
        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            cycle = self.cycle
            seen["headers"] = list(self.headers)
            seen["cycle"] = {
                name: hasattr(cycle, name)
                for name in (
                    "body",
                    "more_body",
                    "disconnected",
                    "response_started",
                    "response_complete",
                )
            }
            seen["scope is shared"] = cycle.scope is self.scope

        def on_response_complete(self) -> None:
            seen["response complete"] = self.cycle.response_complete
            super().on_response_complete()

    async def scenario() -> None:
        answered = asyncio.get_running_loop().create_future()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            message = await receive()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": message["body"]})
            answered.set_result(None)

        config = uvicorn.Config(app, lifespan="off", http="httptools")
        config.load()
        protocol = Recording(config=config, server_state=ServerState(), app_state={})
        protocol.connection_made(Transport())  # type: ignore[arg-type]
        seen["loop"] = protocol.loop is asyncio.get_running_loop()
        seen["flow"] = all(
            callable(getattr(protocol.flow, name, None))
            for name in ("pause_reading", "resume_reading")
        )
        seen["parser"] = isinstance(protocol.parser, httptools.HttpRequestParser)
        protocol.data_received(b"PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbody")
        await asyncio.wait_for(answered, 5)
        protocol.connection_lost(None)

    asyncio.run(scenario())
    assert seen.get("loop"), changed("HttpToolsProtocol.loop is not its event loop")
    assert seen.get("flow"), changed("HttpToolsProtocol.flow cannot pause and resume reading")
    assert seen.get("parser"), changed("HttpToolsProtocol.parser is not an HttpRequestParser")
    assert (b"content-length", b"4") in seen.get("headers", []), changed(
        "HttpToolsProtocol.headers is not the head's (name, value) pairs in bytes"
    )
    assert seen.get("cycle") == dict.fromkeys(
        ("body", "more_body", "disconnected", "response_started", "response_complete"), True
    ), changed(f"RequestResponseCycle's state changed: {seen.get('cycle')}")
    assert seen.get("scope is shared"), changed("a cycle's scope is not its protocol's")
    assert seen.get("response complete") is True, changed(
        "on_response_complete is not called once a response is complete"
    )


def test_httptools_parsers_still_take_the_leniency_connections_sets() -> None:
    parser = httptools.HttpRequestParser(object())
    try:
        parser.set_dangerous_leniencies(lenient_data_after_close=True)
    except (AttributeError, TypeError) as error:
        pytest.fail(changed(f"set_dangerous_leniencies(lenient_data_after_close=True): {error}"))
