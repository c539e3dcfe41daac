"""``reqcrypt engines``: the service's crypto engine models, one line each."""

from __future__ import annotations

import typer

from app.commands.client import Service, with_service
from app.commands.sizes import format_size


@with_service()
def engines(service: Service) -> None:
    """List engine models: bulk IV modes, largest call, setup cost and throughput."""
    profiles = service.request("GET", "/v1/engines").json()
    rows = [("NAME", "BULK IV MODES", "MAX CALL", "SETUP", "ENCRYPT")]
    for profile in profiles:
        caps, cost = profile["capabilities"], profile["cost"]
        largest = caps["max_bytes_per_call"]
        rows.append(
            (
                profile["name"],
                ",".join(caps["bulk_ivmodes"]) or "-",
                format_size(largest) if largest else "-",
                f"{cost['setup_ns'] / 1e3:.1f}us",
                f"{cost['encrypt_bytes_per_s'] / 1e6:.0f}MB/s",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        left = "  ".join(cell.ljust(width) for cell, width in zip(row[:2], widths[:2], strict=True))
        right = "  ".join(
            cell.rjust(width) for cell, width in zip(row[2:], widths[2:], strict=True)
        )
        typer.echo(f"{left}  {right}")
