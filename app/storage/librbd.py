"""librados and librbd through their C API (ctypes), for ``app.storage.rbd``.

The Python bindings run every aio completion as a Python callback on librbd's callback
thread, under the GIL; the C API lets a completion carry no callback and be waited for
by the thread that needs it. ctypes drops the GIL around every call that may block (CDLL).
The aio calls run from ``app._native`` (``rbd_aio_start``, ``rbd_collect``) through the
addresses ctypes finds: one call starts a request, one collects a batch's completions.
Failures raise ``CephError`` with librados' / librbd's errno.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable, Iterable, Sequence
from ctypes import (
    CFUNCTYPE,
    POINTER,
    byref,
    c_char_p,
    c_int,
    c_size_t,
    c_uint8,
    c_uint64,
    c_void_p,
)
from typing import Any

from typing_extensions import Buffer

from app import _native

LOCK_MODE_EXCLUSIVE = 0  # rbd_lock_mode_t
FEATURES = {
    "layering": 1 << 0,
    "exclusive-lock": 1 << 2,
    "object-map": 1 << 3,
    "fast-diff": 1 << 4,
}


class CephError(Exception):
    """A librados / librbd call answered a negative errno."""

    def __init__(self, code: int, call: str) -> None:
        super().__init__(f"{call}: {os.strerror(code)}")
        self.errno = code


class _Libraries:
    """librados.so.2 and librbd.so.1, their functions declared; loaded at the first use."""

    def __init__(self) -> None:
        rados = ctypes.CDLL("librados.so.2")
        rbd = ctypes.CDLL("librbd.so.1")
        self.free = ctypes.CDLL(None).free
        self.free.argtypes = (c_void_p,)
        self.free.restype = None
        handle = c_void_p
        declare = _declarer(rados)
        self.rados_create2 = declare("rados_create2", POINTER(handle), c_char_p, c_char_p, c_uint64)
        self.rados_conf_read_file = declare("rados_conf_read_file", handle, c_char_p)
        self.rados_conf_set = declare("rados_conf_set", handle, c_char_p, c_char_p)
        self.rados_connect = declare("rados_connect", handle)
        self.rados_shutdown = declare("rados_shutdown", handle, restype=None)
        self.rados_ioctx_create = declare("rados_ioctx_create", handle, c_char_p, POINTER(handle))
        self.rados_ioctx_destroy = declare("rados_ioctx_destroy", handle, restype=None)
        self.rados_getaddrs = declare("rados_getaddrs", handle, POINTER(c_void_p))
        self.rados_buffer_free = declare("rados_buffer_free", c_void_p, restype=None)
        self.rados_mon_command = declare(
            "rados_mon_command",
            handle,
            POINTER(c_char_p),
            c_size_t,
            c_char_p,
            c_size_t,
            POINTER(c_void_p),
            POINTER(c_size_t),
            POINTER(c_void_p),
            POINTER(c_size_t),
        )
        declare = _declarer(rbd)
        self.rbd_create2 = declare(
            "rbd_create2", handle, c_char_p, c_uint64, c_uint64, POINTER(c_int)
        )
        self.rbd_remove = declare("rbd_remove", handle, c_char_p)
        self.rbd_open = declare("rbd_open", handle, c_char_p, POINTER(handle), c_char_p)
        self.rbd_close = declare("rbd_close", handle)
        self.rbd_get_size = declare("rbd_get_size", handle, POINTER(c_uint64))
        self.rbd_resize = declare("rbd_resize", handle, c_uint64)
        self.rbd_flush = declare("rbd_flush", handle)
        self.rbd_discard = declare("rbd_discard", handle, c_uint64, c_uint64)
        self.rbd_write_zeroes = declare(
            "rbd_write_zeroes", handle, c_uint64, c_size_t, c_int, c_int
        )
        self.rbd_diff_iterate2 = declare(
            "rbd_diff_iterate2",
            handle,
            c_char_p,
            c_uint64,
            c_uint64,
            c_uint8,
            c_uint8,
            _DIFF_CALLBACK,
            c_void_p,
        )
        self.rbd_is_exclusive_lock_owner = declare(
            "rbd_is_exclusive_lock_owner", handle, POINTER(c_int)
        )
        self.rbd_lock_acquire = declare("rbd_lock_acquire", handle, c_int)
        self.rbd_lock_release = declare("rbd_lock_release", handle)
        self.rbd_lock_break = declare("rbd_lock_break", handle, c_int, c_char_p)
        self.rbd_lock_get_owners = declare(
            "rbd_lock_get_owners", handle, POINTER(c_int), POINTER(c_char_p), POINTER(c_size_t)
        )
        self.rbd_lock_get_owners_cleanup = declare(
            "rbd_lock_get_owners_cleanup", POINTER(c_char_p), c_size_t, restype=None
        )
        self.rbd_watchers_list = declare("rbd_watchers_list", handle, c_void_p, POINTER(c_size_t))
        # The aio calls run from app._native, which starts a request in one call and
        # collects a batch's completions under one release of the GIL.
        _native.rbd_bind(
            *(
                _address(getattr(rbd, name))
                for name in (
                    "rbd_aio_create_completion",
                    "rbd_aio_readv",
                    "rbd_aio_writev",
                    "rbd_aio_is_complete",
                    "rbd_aio_wait_for_complete",
                    "rbd_aio_get_return_value",
                    "rbd_aio_release",
                )
            )
        )


def _address(function: Any) -> int:
    address: int | None = ctypes.cast(function, c_void_p).value
    assert address is not None
    return address


_DIFF_CALLBACK = CFUNCTYPE(c_int, c_uint64, c_size_t, c_int, c_void_p)


def _declarer(library: ctypes.CDLL) -> Callable[..., Any]:
    def declare(name: str, *argtypes: Any, restype: Any = c_int) -> Any:
        function = getattr(library, name)
        function.argtypes = argtypes
        function.restype = restype
        return function

    return declare


_libraries: _Libraries | None = None


def libraries() -> _Libraries:
    """The loaded libraries (``OSError`` when librados2 / librbd1 are not installed)."""
    global _libraries
    if _libraries is None:
        _libraries = _Libraries()
    return _libraries


def _checked(code: int, call: str) -> int:
    if code < 0:
        raise CephError(-code, call)
    return code


class Rados:
    """One librados connection (a client instance with an address of its own)."""

    def __init__(self, conf: str, name: str, options: dict[str, str]) -> None:
        self._lib = libraries()
        self.handle = c_void_p()
        _checked(
            self._lib.rados_create2(byref(self.handle), b"ceph", name.encode(), 0), "rados_create2"
        )
        try:
            _checked(self._lib.rados_conf_read_file(self.handle, conf.encode()), "conf_read_file")
            for key, value in options.items():
                _checked(
                    self._lib.rados_conf_set(self.handle, key.encode(), value.encode()),
                    f"conf_set {key}",
                )
            _checked(self._lib.rados_connect(self.handle), "connect")
        except CephError:
            self.shutdown()
            raise

    def ioctx(self, pool: str) -> Ioctx:
        handle = c_void_p()
        _checked(self._lib.rados_ioctx_create(self.handle, pool.encode(), byref(handle)), pool)
        return Ioctx(handle)

    def addrs(self) -> str:
        """This client's addresses as the OSD map's blocklist names them."""
        addrs = c_void_p()
        _checked(self._lib.rados_getaddrs(self.handle, byref(addrs)), "getaddrs")
        try:
            return ctypes.string_at(addrs.value).decode() if addrs.value else ""
        finally:
            self._lib.free(addrs)

    def mon_command(self, command: str) -> tuple[int, bytes, str]:
        """``command`` (JSON) to the monitors: their return code, output and status."""
        commands = (c_char_p * 1)(command.encode())
        out, outs = c_void_p(), c_void_p()
        out_length, outs_length = c_size_t(), c_size_t()
        code = self._lib.rados_mon_command(
            self.handle, commands, 1, b"", 0, byref(out), byref(out_length), byref(outs),
            byref(outs_length),
        )  # fmt: skip
        try:
            data = ctypes.string_at(out.value, out_length.value) if out.value else b""
            status = ctypes.string_at(outs.value, outs_length.value) if outs.value else b""
        finally:
            if out.value:
                self._lib.rados_buffer_free(out)
            if outs.value:
                self._lib.rados_buffer_free(outs)
        return code, data, status.decode(errors="replace")

    def shutdown(self) -> None:
        if self.handle.value:
            self._lib.rados_shutdown(self.handle)
            self.handle = c_void_p()


class Ioctx:
    """One pool's I/O context on a connection."""

    def __init__(self, handle: c_void_p) -> None:
        self.handle = handle

    def close(self) -> None:
        if self.handle.value:
            handle, self.handle = self.handle, c_void_p()
            libraries().rados_ioctx_destroy(handle)


def create_image(ioctx: Ioctx, name: str, size: int, features: Iterable[str]) -> None:
    flags = 0
    for feature in features:
        flags |= FEATURES[feature]
    order = c_int(0)
    lib = libraries()
    _checked(lib.rbd_create2(ioctx.handle, name.encode(), size, flags, byref(order)), "create")


def remove_image(ioctx: Ioctx, name: str) -> None:
    _checked(libraries().rbd_remove(ioctx.handle, name.encode()), "remove")


class Image:
    """One open RBD image (an ``rbd_image_t``)."""

    def __init__(self, ioctx: Ioctx, name: str) -> None:
        self._lib = libraries()
        self.handle = c_void_p()
        _checked(self._lib.rbd_open(ioctx.handle, name.encode(), byref(self.handle), None), "open")

    def size(self) -> int:
        size = c_uint64()
        _checked(self._lib.rbd_get_size(self.handle, byref(size)), "get_size")
        return size.value

    def resize(self, size: int) -> None:
        _checked(self._lib.rbd_resize(self.handle, size), "resize")

    def aio_start(
        self, offset: int, buffers: Sequence[Buffer], end: int, *, write: bool
    ) -> _native.RbdAio:
        """Start a read into ``buffers`` (writable; held until collected) or a write of them
        (copied by librbd before this returns: the caller may reuse them). ``ValueError``
        if the range passes ``end``; ``CephError`` if librbd refuses the request."""
        try:
            return _native.rbd_aio_start(self.handle.value, offset, buffers, end, write)
        except OSError as exc:
            raise CephError(
                exc.errno or errno.EIO, "aio_writev" if write else "aio_readv"
            ) from None

    def flush(self) -> None:
        _checked(self._lib.rbd_flush(self.handle), "flush")

    def discard(self, offset: int, length: int) -> None:
        _checked(self._lib.rbd_discard(self.handle, offset, length), "discard")

    def write_zeroes(self, offset: int, length: int) -> None:
        _checked(self._lib.rbd_write_zeroes(self.handle, offset, length, 0, 0), "write_zeroes")

    def allocated_bytes(self, length: int) -> int:
        """Bytes of the objects in ``[0, length)`` that exist (whole-object diff, from the
        object map)."""
        total = 0

        def extent(_offset: int, size: int, exists: int, _arg: object) -> int:
            nonlocal total
            if exists:
                total += size
            return 0

        callback = _DIFF_CALLBACK(extent)
        _checked(
            self._lib.rbd_diff_iterate2(self.handle, None, 0, length, 1, 1, callback, None),
            "diff_iterate",
        )
        return total

    def is_exclusive_lock_owner(self) -> bool:
        owner = c_int()
        _checked(self._lib.rbd_is_exclusive_lock_owner(self.handle, byref(owner)), "lock owner")
        return owner.value != 0

    def lock_acquire(self) -> None:
        _checked(self._lib.rbd_lock_acquire(self.handle, LOCK_MODE_EXCLUSIVE), "lock_acquire")

    def lock_release(self) -> None:
        _checked(self._lib.rbd_lock_release(self.handle), "lock_release")

    def lock_owners(self) -> list[bytes]:
        """The exclusive lock's holders (none: an empty list)."""
        mode = c_int()
        capacity = 8
        while True:
            owners = (c_char_p * capacity)()
            count = c_size_t(capacity)
            code = self._lib.rbd_lock_get_owners(self.handle, byref(mode), owners, byref(count))
            if code == -errno.ERANGE:
                capacity = count.value
                continue
            if code == -errno.ENOENT:
                return []
            _checked(code, "lock_get_owners")
            names = [bytes(owners[index] or b"") for index in range(count.value)]
            self._lib.rbd_lock_get_owners_cleanup(owners, count.value)
            return names

    def lock_break(self, owner: bytes) -> None:
        _checked(self._lib.rbd_lock_break(self.handle, LOCK_MODE_EXCLUSIVE, owner), "lock_break")

    def watchers(self) -> int:
        """How many clients watch the image (this handle is one)."""
        count = c_size_t(0)
        code = self._lib.rbd_watchers_list(self.handle, None, byref(count))
        if code != -errno.ERANGE:
            _checked(code, "watchers_list")
        return count.value

    def close(self) -> None:
        if self.handle.value:
            handle, self.handle = self.handle, c_void_p()
            _checked(self._lib.rbd_close(handle), "close")
