"""Secrets kept as 0600 files in the data directory, created on first start."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from app.config import Settings


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text + "\n")


def _read_private(path: Path) -> str:
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise PermissionError(f"{path} must not be readable by group or others (mode {mode:o})")
    return path.read_text().strip()


def load_master_key(settings: Settings) -> bytes:
    """The key-wrapping key: from the environment, else a 0600 file made on first start."""
    if settings.master_key is not None:
        return bytes.fromhex(settings.master_key.get_secret_value())
    path = settings.resolved_master_key_file
    if not path.exists():
        with contextlib.suppress(FileExistsError):
            _write_private(path, secrets.token_hex(32))
    key = bytes.fromhex(_read_private(path))
    if len(key) != 32:
        raise ValueError(f"{path} must hold 64 hex digits")
    return key


def admin_token_path(settings: Settings) -> Path:
    return settings.data_dir / "admin.token"


def load_admin_token(settings: Settings) -> tuple[str, bool]:
    """The admin bearer token and whether it was generated (and so must be announced)."""
    if settings.admin_token is not None:
        return settings.admin_token.get_secret_value(), False
    path = admin_token_path(settings)
    created = False
    if not path.exists():
        try:
            _write_private(path, secrets.token_urlsafe(32))
            created = True
        except FileExistsError:
            pass
    return _read_private(path), created
