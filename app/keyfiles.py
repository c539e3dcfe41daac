"""Secrets kept as 0600 files in the data directory (itself 0700), created on first start.

Master key rotation keeps the key file and the database in step across a crash:
the new key is first written durably beside the file (``master.key.new``), the
database is re-wrapped under it in one transaction, then the side file is renamed
over the old one. ``settle_master_key`` at start finishes or rolls back a rotation
that was interrupted, by asking which of the two keys the database's check value names.

One master key per deployment: the first node to start records ``key_check_value``
of its key in SQL; every node compares its own against it at start, and a node whose
key file is missing never generates one when a value is recorded (it would be a
second key, and its volumes unreadable by the rest of the cluster).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from app.config import Settings

KeyProbe = Callable[[bytes], bool | None]
"""Whether a master key unwraps every stored key: True, False, or None when none is stored."""

KEY_CHECK_LABEL = b"reqcrypt master key check v1"


def key_check_value(key: bytes) -> bytes:
    """What SQL holds of the master key: an HMAC of a fixed label under it. Equal values
    mean equal keys; the value tells nothing of the key."""
    return hmac.new(key, KEY_CHECK_LABEL, hashlib.sha256).digest()


class MasterKeyError(Exception):
    """The master key cannot be used: it does not unwrap the stored keys, or cannot be rotated."""


class ServiceRunning(Exception):
    """Another process (a running ``reqcrypt serve``) holds the data directory."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _private_dir(path: Path) -> None:
    """``path`` as a directory only its owner enters: made 0700, or tightened to it when
    it is ours and looser (a data directory made 0755 by an older reqcrypt). Another
    user's directory, or a shared one with the sticky bit (``/tmp``), keeps its mode."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid == os.geteuid() and info.st_mode & 0o077 and not info.st_mode & stat.S_ISVTX:
        path.chmod(stat.S_IMODE(info.st_mode) & ~0o077)


def make_data_dir(settings: Settings) -> None:
    """The data directory and its devices directory, 0700: the database, the key files and
    the device images in them are nobody else's to list or open."""
    _private_dir(settings.data_dir)
    _private_dir(settings.devices_dir)


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    _fsync_dir(path.parent)


def _read_private(path: Path) -> str:
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise PermissionError(f"{path} must not be readable by group or others (mode {mode:o})")
    return path.read_text().strip()


def load_master_key(settings: Settings, *, create: bool = True) -> bytes:
    """The key-wrapping key: from the environment, else a 0600 file made on first start
    (unless ``create`` is false: the database already has a key recorded)."""
    if settings.master_key is not None:
        return bytes.fromhex(settings.master_key.get_secret_value())
    path = settings.resolved_master_key_file
    if not path.exists():
        if not create:
            raise MasterKeyError(
                f"{path} does not exist and the database has a master key recorded: "
                "supply the cluster's master key (that file or REQCRYPT_MASTER_KEY)"
            )
        with contextlib.suppress(FileExistsError):
            _write_private(path, secrets.token_hex(32))
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    try:
        key = bytes.fromhex(_read_private(path))
    except ValueError:
        key = b""
    if len(key) != 32:
        raise MasterKeyError(f"{path} must hold 64 hex digits")
    return key


def master_key_source(settings: Settings) -> str:
    """Where the master key comes from, for messages: the variable or the file."""
    if settings.master_key is not None:
        return "REQCRYPT_MASTER_KEY"
    return str(settings.resolved_master_key_file)


def not_the_recorded_key(settings: Settings) -> MasterKeyError:
    return MasterKeyError(
        f"the master key in {master_key_source(settings)} is not the one recorded in the "
        "database: supply the cluster's master key"
    )


def pending_master_key_path(settings: Settings) -> Path:
    path = settings.resolved_master_key_file
    return path.with_name(path.name + ".new")


def write_pending_master_key(settings: Settings) -> bytes:
    """Step 1 of a rotation: a fresh key, durable in the side file before any row changes."""
    if settings.master_key is not None:
        raise MasterKeyError(
            "the master key comes from REQCRYPT_MASTER_KEY: rotate it where that variable is set"
        )
    key = secrets.token_bytes(32)
    _write_private(pending_master_key_path(settings), key.hex())
    return key


def commit_pending_master_key(settings: Settings) -> None:
    """Last step of a rotation, after the re-wrapped rows are committed: the atomic rename."""
    path = settings.resolved_master_key_file
    os.replace(pending_master_key_path(settings), path)
    _fsync_dir(path.parent)


def settle_master_key(settings: Settings, unwraps: KeyProbe, recorded: bytes | None) -> bytes:
    """The master key the stored keys are under, finishing or undoing a cut-short rotation.

    ``recorded`` is the database's check value; without one (a database from before it
    was kept) the stored keys themselves are asked. Raises ``MasterKeyError`` when the
    key does not fit: serving with it would give garbage (or nothing) for every volume.
    """

    def fits(key: bytes) -> bool:
        if recorded is not None:
            return hmac.compare_digest(key_check_value(key), recorded)
        return unwraps(key) is not False

    key = load_master_key(settings, create=recorded is None)
    pending = pending_master_key_path(settings)
    if settings.master_key is None and pending.exists():
        new = _read_key(pending)
        if fits(new):  # the re-wrap committed: finish the rename
            commit_pending_master_key(settings)
            return new
        if fits(key):  # it did not: the old key stays
            pending.unlink()
            _fsync_dir(pending.parent)
            return key
    if fits(key):
        return key
    if recorded is not None:
        raise not_the_recorded_key(settings)
    raise MasterKeyError(
        f"the master key in {master_key_source(settings)} does not unwrap the stored keys "
        "(wrong key, or a key file from another data directory)"
    )


@contextlib.contextmanager
def data_dir_lock(settings: Settings, *, exclusive: bool) -> Iterator[None]:
    """``serve`` holds it shared for its lifetime; ``rotate-master-key`` needs it alone."""
    make_data_dir(settings)
    fd = os.open(settings.data_dir / "reqcrypt.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ServiceRunning(f"{settings.data_dir} is in use by a running reqcrypt") from None
        yield
    finally:
        os.close(fd)


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
