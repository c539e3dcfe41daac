"""RBD images on a Ceph cluster, through librados' and librbd's C API (``app.storage.librbd``).

One ``CephCluster`` per process holds the one librados connection every image shares
(connected lazily, at the first RBD device). Ceph fences per connection: a lock broken
by another node blocklists this connection, so every image it has open fails over at once;
a new connection (``CephCluster.reconnect``) is a new client, not blocklisted.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

from typing_extensions import Buffer

from app import _native
from app.errors import AlreadyExists, DeviceBusy, DeviceClaimed, Fenced, InvalidInput, Unavailable
from app.storage import librbd
from app.storage.base import BackingStore, close_all
from app.storage.librbd import CephError
from app.vocab import Wait

IMAGE_FEATURES = (
    "layering",
    "exclusive-lock",  # claim()/release() and Ceph's fencing need it
    "object-map",
    "fast-diff",  # allocated_bytes without reading every object
)


class CephCluster:
    """The process's librados connection and one I/O context per pool, made on first use."""

    def __init__(
        self,
        conf: Path,
        *,
        client: str | None = None,
        keyring: Path | None = None,
        timeout_seconds: float = 10.0,
    ) -> None:
        self.conf = conf
        self.client = client
        self.keyring = keyring
        self.timeout_seconds = timeout_seconds
        self._rados: librbd.Rados | None = None
        self._ioctxs: dict[str, librbd.Ioctx] = {}
        self._lock = threading.Lock()
        self.blocklisted = False
        """Set once this connection is seen blocklisted: it never writes again; a cluster
        node then drops its RBD volumes and ``reconnect``s."""

    def _connect(self) -> librbd.Rados:
        """A new librados connection: a new client instance, with an address of its own."""
        try:
            librbd.libraries()
        except OSError:
            raise Unavailable("the RBD store needs librados2 and librbd1 (Debian)") from None
        options = {
            # a discard must read back as zeros even where it covers part of an object
            "rbd_skip_partial_discard": "false",
            # aio requests are issued on the submitting thread (a data path worker), not
            # handed to librbd's one op thread first: a thread hop per I/O saved
            "rbd_non_blocking_aio": "false",
            # librbd copies a write's buffers before aio_writev returns: the caller's are free
            "rbd_disable_zero_copy_writes": "true",
            # librbd's default cache (writearound) acknowledges a write before the OSDs
            # answer: a client fenced a moment ago would acknowledge writes that never land
            "rbd_cache": "false",
            "client_mount_timeout": str(max(1, round(self.timeout_seconds))),
        }
        if self.keyring is not None:
            options["keyring"] = str(self.keyring)
        name = f"client.{self.client or 'admin'}"
        try:
            return librbd.Rados(str(self.conf), name, options)
        except CephError as exc:
            raise Unavailable(f"Ceph cluster of {self.conf} is unreachable: {exc}") from None

    def _connected(self) -> librbd.Rados:
        if self._rados is None:
            self._rados = self._connect()
        return self._rados

    def reconnect(self, close_images: Callable[[], None]) -> None:
        """Replace a blocklisted connection: the blocklist names the old client's address,
        never a new one's. Connects first (``Unavailable``: nothing changed, still
        blocklisted), then ``close_images`` closes every image opened on the old
        connection, which is shut down after them; the caller reopens the images."""
        fresh = self._connect()
        close_images()
        with self._lock:
            old, self._rados = self._rados, fresh
            ioctxs, self._ioctxs = self._ioctxs, {}
            self.blocklisted = False
        for ioctx in ioctxs.values():
            ioctx.close()
        if old is not None:
            old.shutdown()

    def ioctx(self, pool: str) -> librbd.Ioctx:
        with self._lock:
            ioctx = self._ioctxs.get(pool)
            if ioctx is None:
                cluster = self._connected()
                try:
                    ioctx = cluster.ioctx(pool)
                except CephError as exc:
                    if exc.errno == errno.ENOENT:
                        raise InvalidInput(f"Ceph pool {pool!r} does not exist") from None
                    raise Unavailable(f"Ceph pool {pool!r}: {exc}") from None
                self._ioctxs[pool] = ioctx
            return ioctx

    def refused(self, ioctx: librbd.Ioctx) -> None:
        """An I/O on ``ioctx`` was refused as blocklisted: so is the connection, unless
        ``ioctx`` belongs to one already replaced (a late answer to an old I/O)."""
        with self._lock:
            if any(ioctx is current for current in self._ioctxs.values()):
                self.blocklisted = True

    def ping(self) -> None:
        """Ask the monitors for their status and whether this connection is blocklisted:
        what /readyz reports (connects if needed)."""
        with self._lock:
            cluster = self._connected()
        self._mon(cluster, "mon stat")
        if not self.blocklisted:
            listed = self._mon(cluster, "osd blocklist ls")
            if f'"{cluster.addrs()}"' in listed:
                with self._lock:  # unless a reconnect replaced it meanwhile
                    self.blocklisted = self.blocklisted or self._rados is cluster
        if self.blocklisted:
            raise Fenced(
                "this node's Ceph client is blocklisted (another node took over one of its "
                "RBD devices): it can no longer write to any image until it reconnects"
            )

    def _mon(self, cluster: librbd.Rados, prefix: str) -> str:
        command = json.dumps({"prefix": prefix, "format": "json"})
        code, out, status = cluster.mon_command(command)
        if code != 0:
            raise Unavailable(f"Ceph monitors answered {code}: {status}")
        text: str = out.decode(errors="replace")
        return text

    def close(self) -> None:
        with self._lock:
            close_all(self._ioctxs)
            if self._rados is not None:
                self._rados.shutdown()
                self._rados = None


def _io_error(code: int | None, what: str, detail: str) -> NoReturn:
    """librbd's error as the domain's: a fenced client is told so, the rest stay OSErrors."""
    if code == errno.ESHUTDOWN:  # librados, once this client was blocklisted
        raise Fenced(f"{what}: this node was fenced off the Ceph cluster (blocklisted)") from None
    if code == errno.EROFS:  # librbd: another client holds the lock and keeps it
        raise Fenced(f"{what}: another node holds the device's exclusive lock") from None
    raise OSError(code or errno.EIO, f"{what}: {detail}") from None


class _Group:
    """The aio requests one thread submitted since it last waited (a dispatch batch): the
    first wait collects all of them, newest first, so it sleeps about once (until the last
    completes) and the other waits find their results set."""

    __slots__ = ("closed", "lock", "members")

    def __init__(self) -> None:
        self.members: list[_native.RbdAio] = []  # appended to once started (atomic under the GIL)
        self.closed = False
        self.lock = threading.Lock()

    def wait(self) -> None:
        """Close the group and collect every request in it, late joiners included; one
        thread at a time (a completion is released by whoever collects it)."""
        with self.lock:
            self.closed = True
            _native.rbd_collect(self.members)


class RbdStore(BackingStore):
    """One RBD image. librbd handles are thread-safe; every call that may block drops the GIL.

    ``submit_readv``/``submit_writev`` are librbd's aio calls on the request's segments
    (adjacent segments one iovec entry: a read lands in them, librbd copies a write), so
    the requests of a dispatch batch are in flight on the OSDs together rather than one
    round trip each (``aio=False``: each request waited for before the next, as
    ``readv_into``/``writev``). Completions carry no callback, so librbd's threads never
    take the GIL: the dispatcher collects a batch's completions when it first waits
    (``_Group``), sleeping about once per batch.
    """

    def __init__(
        self,
        ioctx: librbd.Ioctx,
        image: str,
        size: int,
        *,
        create: bool = False,
        cluster: CephCluster | None = None,
        aio: bool = True,
    ) -> None:
        self.image_name = image
        self.aio = aio
        self._groups = threading.local()
        self._ioctx = ioctx
        self._cluster = cluster
        if create:
            try:
                librbd.create_image(ioctx, image, size, IMAGE_FEATURES)
            except CephError as exc:
                if exc.errno == errno.EEXIST:
                    raise AlreadyExists(f"RBD image {image} exists") from None
                self._failed(exc, f"creation of {image}")
        try:
            self._image: librbd.Image | None = librbd.Image(ioctx, image)
        except CephError as exc:
            if exc.errno == errno.ENOENT:
                raise InvalidInput(f"RBD image {image} does not exist") from None
            self._failed(exc, f"opening of {image}")
        self._size = size
        if self._call("size of", self._open().size) < size:
            self._call("resize of", self._open().resize, size)

    @property
    def size(self) -> int:
        return self._size

    def _open(self) -> librbd.Image:
        if self._image is None:
            raise OSError(errno.EBADF, f"RBD image {self.image_name} is closed")
        return self._image

    def _failed(self, exc: CephError, what: str) -> NoReturn:
        self._failed_with(exc.errno, what, str(exc))

    def _failed_with(self, code: int | None, what: str, detail: str) -> NoReturn:
        if self._cluster is not None and code == errno.ESHUTDOWN:
            self._cluster.refused(self._ioctx)
        _io_error(code, what, detail)

    def _call(self, verb: str, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)``, one librbd call on the image; its error raised as the domain's,
        named ``verb`` and the image (the message made only then)."""
        try:
            return call(*args)
        except CephError as exc:
            self._failed(exc, f"{verb} {self.image_name}")

    def read_into(self, offset: int, buffer: memoryview) -> None:
        self.readv_into(offset, [buffer])

    def write(self, offset: int, data: Buffer) -> None:
        self.writev(offset, [data])

    def readv_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        """One librbd read for the whole request, landing in its segments.

        Not one read per segment: contiguous segments then become as many OSD ops on the
        same object, measured at a third to a half of one read's throughput (16 x 64 KiB
        vs 1 MiB on memstore); librbd already splits a read across objects and runs the
        pieces in parallel.
        """
        self._readv(offset, buffers, _Group())()

    def writev(self, offset: int, buffers: Sequence[Buffer]) -> None:
        """One librbd write of the segments (``readv_into`` says why not one per segment)."""
        self._writev(offset, buffers, _Group())()

    def _group(self) -> _Group:
        """This thread's open group, a new one once its last was waited for."""
        group: _Group | None = getattr(self._groups, "group", None)
        if group is None or group.closed:
            group = self._groups.group = _Group()
        return group

    def _waited(self, group: _Group, aio: _native.RbdAio, verb: str, length: int | None) -> None:
        """Wait for ``aio`` (its group collected, unless it already was); librbd's error
        (or a short read) raised as the domain's."""
        code = aio.code
        if code is None:
            group.wait()
            code = aio.code
            assert code is not None
        if code < 0:
            self._failed_with(-code, f"{verb} {self.image_name}", os.strerror(-code))
        if length is not None and code != length:
            what = f"{verb} {self.image_name}"
            self._failed_with(errno.EIO, what, f"{code} of {length} bytes")

    def _readv(self, offset: int, buffers: Sequence[Buffer], group: _Group) -> Wait:
        try:
            aio = self._open().aio_start(offset, buffers, self._size, write=False)
        except CephError as exc:
            self._failed(exc, f"read of {self.image_name}")
        group.members.append(aio)
        return partial(self._waited, group, aio, "read of", aio.length)

    def _writev(self, offset: int, buffers: Sequence[Buffer], group: _Group) -> Wait:
        try:
            aio = self._open().aio_start(offset, buffers, self._size, write=True)
        except CephError as exc:
            self._failed(exc, f"write to {self.image_name}")
        group.members.append(aio)
        return partial(self._waited, group, aio, "write to", None)

    def submit_readv(self, offset: int, buffers: Sequence[memoryview]) -> Wait:
        """One aio read for the whole request, into its segments."""
        if not self.aio:
            return super().submit_readv(offset, buffers)
        return self._readv(offset, buffers, self._group())

    def submit_writev(self, offset: int, buffers: Sequence[Buffer]) -> Wait:
        """One aio write of the request's segments, which librbd has copied when this
        returns (the caller's buffers are free at once)."""
        if not self.aio:
            return super().submit_writev(offset, buffers)
        return self._writev(offset, buffers, self._group())

    def flush(self) -> None:
        """``Fenced`` once the connection is known blocklisted: librbd, not yet told, would
        answer a flush with nothing in flight as done."""
        if self._cluster is not None and self._cluster.blocklisted:
            _io_error(errno.ESHUTDOWN, f"flush of {self.image_name}", "blocklisted")
        self._call("flush of", self._open().flush)

    def discard(self, offset: int, length: int) -> None:
        self.check_range(offset, length)
        self._call("discard on", self._open().discard, offset, length)

    def write_zeroes(self, offset: int, length: int) -> None:
        self.check_range(offset, length)
        self._call("write-zeroes on", self._open().write_zeroes, offset, length)

    def allocated_bytes(self) -> int:
        """Bytes of the objects that exist (object granularity, from the object map)."""
        allocated: int = self._call("allocation of", self._open().allocated_bytes, self._size)
        return allocated

    def claim(self, *, take_over: bool = False) -> None:
        """Hold the image's exclusive lock; with ``take_over``, break (and so blocklist) the
        holder first. While held, another client's writes fail with EROFS."""
        image = self._open()
        try:
            if take_over and not image.is_exclusive_lock_owner():
                for owner in image.lock_owners():
                    image.lock_break(owner)
            image.lock_acquire()
        except CephError as exc:
            if exc.errno == errno.EROFS:
                raise DeviceClaimed(
                    f"RBD image {self.image_name} is claimed by another node "
                    "(take over to fence it)"
                ) from None
            self._failed(exc, f"claim of {self.image_name}")

    def release(self) -> None:
        """Give the lock up; nothing to do when this client does not hold it, nor when it
        was blocklisted (its lock is broken, or the next holder breaks it)."""
        image = self._open()
        try:
            if not image.is_exclusive_lock_owner():
                return
            image.lock_release()
        except CephError as exc:
            if exc.errno == errno.ESHUTDOWN:
                if self._cluster is not None:
                    self._cluster.refused(self._ioctx)
                return
            self._failed(exc, f"release of {self.image_name}")

    def close(self) -> None:
        """Close the image; on a blocklisted connection librbd may answer an error, and
        the handle is gone all the same."""
        image, self._image = self._image, None
        if image is not None:
            with contextlib.suppress(CephError):
                image.close()

    def check_unwatched(self) -> None:
        """``DeviceBusy`` while another client has the image open (librbd would refuse
        to remove it): a watcher besides this handle."""
        if self._call("watchers of", self._open().watchers) > 1:
            raise DeviceBusy(f"RBD image {self.image_name} is open by another client")

    def remove(self) -> None:
        """Close, then delete the image (``check_unwatched`` first to know it will go)."""
        self.close()
        try:
            librbd.remove_image(self._ioctx, self.image_name)
        except CephError as exc:
            if exc.errno == errno.ENOENT:
                return
            if exc.errno == errno.EBUSY:
                raise DeviceBusy(
                    f"RBD image {self.image_name} was opened by another client; it is left in place"
                ) from None
            self._failed(exc, f"removal of {self.image_name}")
