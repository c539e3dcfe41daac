"""One canonical request path, decided before anything routes on it.

Routing to a volume's owner, the control-body bound and the routes themselves all read
``scope["path"]`` (percent-decoded by the server); a dot segment would make them read
different paths (``/v1/volumes/a/../b/data`` looks like a control call on ``a`` to a
pattern, and is ``b``'s data path to any client that resolves it, httpx included). RFC 3986
clients remove dot segments before sending, so a path that still holds one (or an encoded
one, ``%2e%2e``, decoded by the time it is here) is refused with 400 rather than resolved:
no two readers can then disagree about it.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable

from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.problems import problem

VOLUME_PATH = re.compile(r"^/v1/volumes/([^/]+)(/.*)?$")
"""A volume's path: its name, and what follows it."""

DATA_PATH = re.compile(r"^/v1/volumes/[^/]+/data$")
"""The one path whose body streams (bounded by the data path's own limits)."""

_DOT_SEGMENT = re.compile(r"(?:^|/)\.{1,2}(?:/|$)")


def has_dot_segment(path: str) -> bool:
    return _DOT_SEGMENT.search(path) is not None


class CanonicalPath:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        if scope["type"] == "http" and has_dot_segment(scope["path"]):
            return self._refuse(scope, receive, send)
        return self.app(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem(
            400,
            "the request path holds a '.' or '..' segment: send it with dot segments "
            "removed (RFC 3986 §5.2.4)",
            headers={"Connection": "close"},
        )
        await response(scope, receive, send)
