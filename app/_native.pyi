from collections.abc import Sequence
from typing import Any, Literal, overload

from numpy.typing import NDArray
from typing_extensions import Buffer

_Bytes = Buffer | NDArray[Any]
_Path = Literal["avx512", "avx2", "aesni", "openssl"]

PATHS: tuple[_Path, ...]

def path() -> _Path: ...
def set_path(name: str, /) -> None: ...
def whiten(dst: _Bytes, src: _Bytes, first_tweaks: _Bytes, unit_bytes: int, /) -> None: ...
def xts(
    dst: _Bytes, src: _Bytes, ivs: _Bytes, key: Buffer, unit_bytes: int, encrypt: bool, /
) -> None: ...

class XtsKey:
    def __init__(self, key: Buffer, /) -> None: ...
    def wipe(self) -> None: ...

def xts_plain64(
    dst: _Bytes,
    src: _Bytes,
    iv_sector: int,
    iv_step: int,
    key: Buffer | XtsKey,
    unit_bytes: int,
    encrypt: bool,
    /,
) -> None: ...
def cbc_encrypt(dst: _Bytes, src: _Bytes, ivs: _Bytes, key: Buffer, unit_bytes: int, /) -> None: ...
def cbc_decrypt(dst: _Bytes, src: _Bytes, ivs: _Bytes, key: Buffer, unit_bytes: int, /) -> None: ...
def essiv(dst: _Bytes, sectors: _Bytes, salt: Buffer, /) -> None: ...

class EssivKey:
    def __init__(self, key: Buffer, salt: Buffer, /) -> None: ...
    def wipe(self) -> None: ...

@overload
def cbc_essiv(
    dst: _Bytes,
    src: _Bytes,
    iv_sector: int,
    iv_step: int,
    key: Buffer,
    salt: Buffer,
    unit_bytes: int,
    encrypt: bool,
    /,
) -> None: ...
@overload
def cbc_essiv(
    dst: _Bytes,
    src: _Bytes,
    iv_sector: int,
    iv_step: int,
    key: EssivKey,
    salt: None,
    unit_bytes: int,
    encrypt: bool,
    /,
) -> None: ...
def pwritev_chunks(
    fd: int, buffers: Sequence[Buffer], offset: int, chunk: int, end: int, /
) -> None: ...
def preadv_into(fd: int, buffers: Sequence[Buffer], offset: int, end: int, /) -> None: ...
def rbd_bind(
    create_completion: int,
    aio_readv: int,
    aio_writev: int,
    is_complete: int,
    wait_for_complete: int,
    get_return_value: int,
    release: int,
    /,
) -> None: ...

class RbdAio:
    @property
    def code(self) -> int | None: ...
    @property
    def length(self) -> int: ...

def rbd_aio_start(
    image: int | None, offset: int, buffers: Sequence[Buffer], end: int, write: bool, /
) -> RbdAio: ...
def rbd_collect(aios: Sequence[RbdAio], /) -> None: ...
