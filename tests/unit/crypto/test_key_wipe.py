"""``key wipe`` zeroes key bytes in memory, in every copy the transform keeps reachable:
the key, its subkeys, IV seeds, ESSIV salts, and the keys of cached ECB contexts."""

from __future__ import annotations

import gc
import hashlib
import os
import types
from collections.abc import Iterator
from functools import partial

import pytest

from app import _native
from app.crypto.keys import KeyMaterial
from app.crypto.spec import parse_cipher_spec
from app.crypto.transform import make_transform

CASES = [
    ("aes-xts-plain64", "bulk"),
    ("aes-xts-plain64", "reference"),
    ("aes-cbc-essiv:sha256", "bulk"),
    ("aes-cbc-essiv:sha256", "reference"),
    ("aes-cbc-lmk", "reference"),
    ("aes-cbc-tcw", "reference"),
    ("aes-cbc-eboiv", "bulk"),
    ("camellia-xts-plain64", "bulk"),
]


def reachable(root: object) -> Iterator[object]:
    """Every object reachable from ``root`` except modules, classes and functions."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        item = stack.pop()
        if id(item) in seen or isinstance(
            item, types.ModuleType | type | types.FunctionType | types.BuiltinFunctionType
        ):
            continue
        seen.add(id(item))
        yield item
        if isinstance(item, memoryview) and not item.released:
            stack.append(item.obj)
        stack.extend(gc.get_referents(item))


def secret_buffers(root: object) -> list[bytearray | memoryview]:
    return [
        item
        for item in reachable(root)
        if isinstance(item, bytearray | memoryview) and len(item) and any(bytes(item))
    ]


def immutable_bytes(root: object) -> list[bytes]:
    return [item for item in reachable(root) if isinstance(item, bytes)]


@pytest.mark.parametrize(("cipher", "impl"), CASES)
def test_wipe_zeroes_every_reachable_copy_of_the_key(cipher: str, impl: str) -> None:
    spec = parse_cipher_spec(cipher)
    key_size = spec.valid_key_sizes[-1]  # the largest: with lmk's seed and tcw's extras
    raw = os.urandom(key_size)
    key = KeyMaterial(raw)
    transform = make_transform(spec, key, impl=impl)  # type: ignore[arg-type]
    data = os.urandom(64 * 512)
    transform.decrypt(transform.encrypt(data, 0), 0)  # caches ECB contexts on the bulk path

    buffers = secret_buffers(transform)
    assert buffers, "the transform holds its key in no zeroable buffer"
    derived = [raw[i : i + 16] for i in range(0, key_size - 15, 8)]
    derived += [hashlib.sha256(raw[:32]).digest()[:16]]  # the ESSIV salt's start
    for frozen in immutable_bytes(transform):
        for secret in derived:
            assert secret not in frozen, "key-derived bytes in an immutable (unwipeable) object"

    transform.wipe()

    for buffer in buffers:
        assert not any(bytes(buffer)), f"{type(buffer).__name__} of {len(buffer)} bytes not zeroed"


def test_wiping_key_material_zeroes_its_backing_buffer_even_with_a_view_out() -> None:
    key = KeyMaterial(os.urandom(32))
    backing = key._data
    view = key.view()
    key.wipe()
    assert backing == bytearray(32)
    assert bytes(view) == bytes(32)
    assert len(key) == 0
    assert key.hex() == "-"


@pytest.mark.parametrize("cipher", ["aes-xts-plain64", "aes-cbc-essiv:sha256"])
def test_wipe_cleanses_the_native_key_schedules(lane_path: str, cipher: str) -> None:
    """The expanded AES schedules live in a native key object, out of ``secret_buffers``'
    sight: after the transform's wipe the object refuses to convert."""
    spec = parse_cipher_spec(cipher)
    transform = make_transform(spec, KeyMaterial(os.urandom(spec.valid_key_sizes[-1])), impl="bulk")
    native_keys = [
        item for item in reachable(transform) if isinstance(item, _native.XtsKey | _native.EssivKey)
    ]
    assert len(native_keys) == 1
    key, out = native_keys[0], bytearray(512)
    convert = (
        partial(_native.xts_plain64, out, bytes(512), 0, 1, key, 512, True)
        if isinstance(key, _native.XtsKey)
        else partial(_native.cbc_essiv, out, bytes(512), 0, 1, key, None, 512, True)
    )
    transform.wipe()
    with pytest.raises(ValueError, match="wiped"):
        convert()
