"""Where the service is, which token to send, and a service's problem as one line on stderr.

URL: ``--url``, else ``REQCRYPT_URL``, else http://127.0.0.1:8000. Token: ``--token``,
else ``REQCRYPT_TOKEN``, else the admin token file a local service wrote into its
data directory (``REQCRYPT_DATA_DIR`` or the default one), else none.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Concatenate, NoReturn, ParamSpec

import httpx
import typer

from app.config import default_data_dir

DEFAULT_URL = "http://127.0.0.1:8000"

UrlOption = Annotated[
    str, typer.Option("--url", envvar="REQCRYPT_URL", help="service base URL", show_envvar=True)
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="REQCRYPT_TOKEN",
        help="bearer token (else the admin token file of a local service)",
        show_envvar=True,
    ),
]


VolumeName = Annotated[str, typer.Argument(metavar="NAME", help="volume name")]


def admin_token_file() -> Path:
    return Path(os.environ.get("REQCRYPT_DATA_DIR") or default_data_dir()) / "admin.token"


def resolve_token(token: str | None) -> str | None:
    if token:
        return token
    try:
        return admin_token_file().read_text().strip() or None
    except OSError:
        return None


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"reqcrypt: {message}", err=True)
    raise typer.Exit(code)


def problem_detail(response: httpx.Response) -> str:
    """The problem+json ``detail`` (RFC 9457), else the body, else the status line."""
    try:
        body = response.json()
        detail = str(body.get("detail") or body.get("title"))
    except (ValueError, AttributeError):
        detail = response.text.strip() or response.reason_phrase
    if response.status_code == 401:
        detail += f" (pass --token, set REQCRYPT_TOKEN, or be able to read {admin_token_file()})"
    return detail


class Service:
    """An httpx client on the service whose errors end the command with the problem's detail."""

    def __init__(self, client: httpx.Client) -> None:
        self.http = client

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as error:
            fail(f"cannot reach {self.http.base_url}: {error}")
        if response.is_error:
            fail(f"{method} {path}: {response.status_code} {problem_detail(response)}")
        return response

    @contextmanager
    def stream(self, method: str, path: str, **kwargs: Any) -> Iterator[httpx.Response]:
        try:
            with self.http.stream(method, path, **kwargs) as response:
                if response.is_error:
                    response.read()
                    fail(f"{method} {path}: {response.status_code} {problem_detail(response)}")
                yield response
        except httpx.HTTPError as error:
            fail(f"cannot reach {self.http.base_url}: {error}")


@contextmanager
def connect(url: str, token: str | None, timeout: float = 60) -> Iterator[Service]:
    resolved = resolve_token(token)
    headers = {"Authorization": f"Bearer {resolved}"} if resolved else {}
    with httpx.Client(base_url=url, headers=headers, timeout=timeout) as client:
        yield Service(client)


P = ParamSpec("P")

_CONNECTION_PARAMETERS = (
    inspect.Parameter(
        "url", inspect.Parameter.KEYWORD_ONLY, default=DEFAULT_URL, annotation=UrlOption
    ),
    inspect.Parameter(
        "token", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=TokenOption
    ),
)


def with_service(
    timeout: float = 60,
) -> Callable[[Callable[Concatenate[Service, P], None]], Callable[..., None]]:
    """A verb that talks to the service: it takes ``--url`` and ``--token`` (last, as every
    verb lists them) and runs with a connection open, its first argument."""

    def decorate(verb: Callable[Concatenate[Service, P], None]) -> Callable[..., None]:
        @functools.wraps(verb)
        def run(*args: Any, url: str, token: str | None, **kwargs: Any) -> None:
            with connect(url, token, timeout) as service:
                verb(service, *args, **kwargs)

        signature = inspect.signature(verb, eval_str=True)
        own = list(signature.parameters.values())[1:]
        run.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[*own, *_CONNECTION_PARAMETERS]
        )
        return run

    return decorate


def listing(service: Service, path: str) -> list[dict[str, Any]]:
    """A collection; an empty one is said the way dmsetup says it."""
    items: list[dict[str, Any]] = service.request("GET", path).json()
    if not items:
        typer.echo("No devices found")
    return items
