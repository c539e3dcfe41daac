"""A stand-in for a socket's transport, for driving an HTTP protocol without a socket."""

from __future__ import annotations

from typing import Any


class Transport:
    """What the protocol asks of a socket's transport; records whether reading is paused."""

    def __init__(self) -> None:
        self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass
