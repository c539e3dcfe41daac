"""``reqcrypt trace NAME``: a volume's blktrace as blkparse prints it, or btt's summary of it."""

from __future__ import annotations

from typing import Annotated

import typer

from app.blk.trace import parse_blkparse, render_summary, summarize
from app.commands.client import DEFAULT_URL, TokenOption, UrlOption, connect


def trace(
    name: Annotated[str, typer.Argument(help="volume name")],
    seconds: Annotated[int, typer.Option("--seconds", "-w", help="how long to trace")] = 10,
    summary: Annotated[
        bool, typer.Option("--summary", help="btt's latencies and merge ratio instead of events")
    ] = False,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Trace a volume's block layer for SECONDS (admin token): Q, M/F, G, P/U, I, D, C, engine.

    Events print as they come, like `blktrace -d DEV -o - | blkparse -i -`; with
    --summary the trace is read whole and summarised like `btt`.
    """
    with (
        connect(url, token, timeout=seconds + 30) as service,
        service.stream("GET", f"/v1/volumes/{name}/trace", params={"seconds": seconds}) as response,
    ):
        if not summary:
            for chunk in response.iter_text():
                typer.echo(chunk, nl=False)
            return
        text = response.read().decode()
    parsed = parse_blkparse(text.splitlines())
    typer.echo(render_summary(summarize(parsed.records)), nl=False)
