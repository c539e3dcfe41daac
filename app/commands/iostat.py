"""``reqcrypt iostat``: ``iostat -x`` for volumes, from the deltas of their queue statistics.

The first report covers the time since the volume's statistics began (as iostat's
first report covers the time since boot); each later one covers the interval.
Columns keep sysstat's names and meanings: requests are what the queue dispatched
after merging, ``rrqm/s`` the bios merged into them, ``r_await`` the bio's time
from submission to completion, ``aqu-sz`` the average number of requests in flight.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from app.commands.client import DEFAULT_URL, Service, TokenOption, UrlOption, connect, fail

EXTENDED = (
    "r/s",
    "w/s",
    "rkB/s",
    "wkB/s",
    "rrqm/s",
    "wrqm/s",
    "%rrqm",
    "%wrqm",
    "r_await",
    "w_await",
    "aqu-sz",
    "rareq-sz",
    "wareq-sz",
    "%util",
)
BASIC = ("tps", "kB_read/s", "kB_wrtn/s", "kB_dscd/s", "kB_read", "kB_wrtn", "kB_dscd")


def report_row(now: dict[str, Any], before: dict[str, Any] | None) -> dict[str, float]:
    """Every column, basic and extended, for one volume between two snapshots."""
    if before is None or before["elapsed_s"] > now["elapsed_s"]:  # first report, or reset
        before = dict.fromkeys(now, 0)
        before["elapsed_s"] = 0.0

    def delta(key: str) -> float:
        return float(now[key]) - float(before[key])

    seconds = max(delta("elapsed_s"), 1e-9)
    row: dict[str, float] = {}
    for group in ("r", "w"):
        ios, merges = delta(f"{group}_ios"), delta(f"{group}_merges")
        kib = delta(f"{group}_sectors") / 2
        done = delta(f"{group}_bios_done")
        row[f"{group}/s"] = ios / seconds
        row[f"{group}kB/s"] = kib / seconds
        row[f"{group}rqm/s"] = merges / seconds
        row[f"%{group}rqm"] = 100 * merges / (merges + ios) if merges + ios else 0.0
        row[f"{group}_await"] = delta(f"{group}_ticks_ms") / done if done else 0.0
        row[f"{group}areq-sz"] = kib / ios if ios else 0.0
    row["aqu-sz"] = delta("time_in_queue_ms") / (seconds * 1e3)
    row["%util"] = min(100.0, 100 * delta("io_ticks_ms") / (seconds * 1e3))
    row["tps"] = (delta("r_ios") + delta("w_ios") + delta("d_ios")) / seconds
    for column, group in (("read", "r"), ("wrtn", "w"), ("dscd", "d")):
        row[f"kB_{column}"] = delta(f"{group}_sectors") / 2
        row[f"kB_{column}/s"] = row[f"kB_{column}"] / seconds
    return row


def format_report(rows: dict[str, dict[str, float]], columns: tuple[str, ...]) -> str:
    width = max([16, *(len(name) + 1 for name in rows)])
    lines = ["Device".ljust(width) + "".join(f"{c:>10}" for c in columns)]
    for name, row in rows.items():
        cells = "".join(
            f"{row[c]:>10.0f}" if c.startswith("kB_") and "/" not in c else f"{row[c]:>10.2f}"
            for c in columns
        )
        lines.append(name.ljust(width) + cells)
    return "\n".join(lines) + "\n"


def split_arguments(words: list[str]) -> tuple[list[str], float | None, int | None]:
    """iostat's positional grammar: device names, then an optional interval and count."""
    numbers: list[str] = []
    while words and len(numbers) < 2 and words[-1].replace(".", "", 1).isdigit():
        numbers.insert(0, words.pop())
    interval = float(numbers[0]) if numbers else None
    count = int(numbers[1]) if len(numbers) > 1 else None
    if interval is not None and interval <= 0:
        raise typer.BadParameter(f"interval {numbers[0]}: must be more than 0 seconds")
    return words, interval, count


def snapshots(service: Service, names: list[str]) -> dict[str, dict[str, Any]]:
    if not names:
        names = [volume["name"] for volume in service.request("GET", "/v1/volumes").json()]
    return {
        name: service.request("GET", f"/v1/volumes/{name}/status").json()["stats"] for name in names
    }


def iostat(
    arguments: Annotated[
        list[str] | None,
        typer.Argument(metavar="[NAME]... [INTERVAL [COUNT]]", help="volumes (default: all)"),
    ] = None,
    extended: Annotated[bool, typer.Option("-x", help="extended statistics")] = False,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Report volume I/O statistics the way iostat(1) reports disks.

    With an INTERVAL, report every INTERVAL seconds (COUNT times, else until
    interrupted); the first report covers the time since statistics began.
    """
    names, interval, count = split_arguments(list(arguments or []))
    reports = count if count is not None else (None if interval is not None else 1)
    columns = EXTENDED if extended else BASIC
    previous: dict[str, dict[str, Any]] = {}
    done = 0
    with connect(url, token) as service:
        try:
            while True:
                current = snapshots(service, names)
                rows = {name: report_row(now, previous.get(name)) for name, now in current.items()}
                typer.echo(format_report(rows, columns))
                previous = current
                done += 1
                if (reports is not None and done >= reports) or interval is None:
                    return
                time.sleep(interval)
        except KeyboardInterrupt:
            fail("interrupted", 130)
