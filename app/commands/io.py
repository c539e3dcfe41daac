"""``reqcrypt io``: move bytes into and out of a volume, dd-style, over HTTP range requests.

Data streams in CHUNK-sized ranges (one PUT or ranged GET each), so neither side
holds a whole volume in memory. A progress bar is drawn only when stderr is a
terminal; in pipes and scripts the command is silent unless something fails.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, Annotated, Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from app.commands.client import (
    DEFAULT_URL,
    Service,
    TokenOption,
    UrlOption,
    VolumeName,
    connect,
    fail,
)
from app.commands.sizes import size

CHUNK = 4 << 20

io_app = typer.Typer(help="Write and read a volume's bytes.", no_args_is_help=True)

OffsetOption = Annotated[
    int,
    typer.Option(
        "--offset",
        parser=size,
        metavar="BYTES",
        help="byte offset in the volume, e.g. 4k, 64M, 1.5G or bytes",
    ),
]


class Meter:
    """rich's transfer bar on a terminal, nothing otherwise."""

    def __init__(self, label: str, total: int | None) -> None:
        self.progress: Progress | None = None
        if sys.stderr.isatty():
            self.progress = Progress(
                TextColumn(label),
                BarColumn(),
                DownloadColumn(binary_units=True),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=False,
            )
            self.task = self.progress.add_task(label, total=total)

    def advance(self, nbytes: int) -> None:
        if self.progress is not None:
            self.progress.advance(self.task, nbytes)

    def __enter__(self) -> Meter:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self.progress is not None:
            self.progress.stop()


def volume_ready(service: Service, command: str, name: str) -> dict[str, Any]:
    """The volume's record; if it is suspended, say so at once, since I/O waits silently."""
    volume: dict[str, Any] = service.request("GET", f"/v1/volumes/{name}").json()
    if volume["state"] == "suspended":
        typer.echo(
            f"reqcrypt: io {command} {name}: volume {name} is suspended: waiting up to "
            f"{volume['suspend_wait_seconds']:g} s for a resume",
            err=True,
        )
    return volume


@contextmanager
def opened(path: str, mode: str) -> Iterator[IO[bytes]]:
    """``-`` is stdin/stdout; anything else a file, with OS errors as one line."""
    if path == "-":
        yield sys.stdin.buffer if "r" in mode else sys.stdout.buffer
        return
    with ExitStack() as stack:
        try:
            handle = stack.enter_context(Path(path).open(mode))
        except OSError as error:
            fail(f"{path}: {error.strerror}")
        yield handle


@io_app.command()
def write(
    name: VolumeName,
    source: Annotated[str, typer.Argument(metavar="FILE|-", help="bytes to write; - for stdin")],
    offset: OffsetOption = 0,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Write FILE (or stdin) into volume NAME at --offset, then flush (like dd conv=fsync)."""
    path = Path(source)
    total = path.stat().st_size if source != "-" and path.is_file() else None
    with (
        connect(url, token) as service,
        opened(source, "rb") as handle,
        Meter(f"write {name}", total) as meter,
    ):
        volume_ready(service, "write", name)
        position = offset
        while chunk := handle.read(CHUNK):
            last = position + len(chunk) - 1
            service.request(
                "PUT",
                f"/v1/volumes/{name}/data",
                content=chunk,
                headers={
                    "Content-Range": f"bytes {position}-{last}/*",
                    "Content-Type": "application/octet-stream",
                },
            )
            position += len(chunk)
            meter.advance(len(chunk))
        service.request("POST", f"/v1/volumes/{name}/flush")


@io_app.command()
def read(
    name: VolumeName,
    offset: OffsetOption = 0,
    length: Annotated[
        int | None,
        typer.Option(
            "--length",
            parser=size,
            metavar="BYTES",
            help="bytes to read (default: to the end of the volume)",
        ),
    ] = None,
    output: Annotated[
        str, typer.Option("-o", "--output", metavar="FILE|-", help="where to; - for stdout")
    ] = "-",
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Read volume NAME from --offset for --length bytes into FILE or stdout."""
    with connect(url, token) as service:
        volume = volume_ready(service, "read", name)
        if length is None:
            length = max(0, int(volume["size_bytes"]) - offset)
        end = offset + length
        with opened(output, "wb") as handle, Meter(f"read {name}", length) as meter:
            position = offset
            while position < end:
                last = min(end, position + CHUNK) - 1
                with service.stream(
                    "GET", f"/v1/volumes/{name}/data", headers={"Range": f"bytes={position}-{last}"}
                ) as response:
                    for data in response.iter_bytes():
                        handle.write(data)
                        meter.advance(len(data))
                position = last + 1
            handle.flush()
