"""What every ``Engine`` promises its caller, checked on each implementation (zarr-style suite)."""

from __future__ import annotations

import os

import pytest

from app.crypto.keys import KeyMaterial
from app.crypto.spec import parse_cipher_spec
from app.crypto.transform import CryptTransform, make_transform
from app.engine.base import Engine, EngineRequest
from app.engine.mock import MockEngine
from app.engine.presets import OMAP_AES_AM335X, SOFTWARE
from app.engine.simulated import SimulatedEngine

pytestmark = pytest.mark.usefixtures("engine_model")


@pytest.fixture
def transform() -> CryptTransform:
    spec = parse_cipher_spec("aes-cbc-plain64")
    return make_transform(spec, KeyMaterial(os.urandom(32)))


class EngineTests:
    def make_engine(self) -> Engine:
        raise NotImplementedError

    def test_decrypt_undoes_encrypt_segment_by_segment(self, transform: CryptTransform) -> None:
        engine = self.make_engine()
        segments = [os.urandom(1024), os.urandom(3072)]
        sealed = engine.process(EngineRequest("encrypt", transform, segments, 16, "request"))
        assert [len(out) for out in sealed.outputs] == [1024, 3072]
        assert b"".join(bytes(out) for out in sealed.outputs) == transform.encrypt(
            b"".join(segments), 16
        )
        opened = engine.process(EngineRequest("decrypt", transform, sealed.outputs, 16, "request"))
        assert [bytes(out) for out in opened.outputs] == segments

    def test_into_buffers_receive_the_output(self, transform: CryptTransform) -> None:
        engine = self.make_engine()
        sealed = transform.encrypt(b"p" * 2048, 0)
        pages = [memoryview(bytearray(sealed[:512])), memoryview(bytearray(sealed[512:]))]
        result = engine.process(
            EngineRequest("decrypt", transform, pages, 0, "request", into=pages)
        )
        assert b"".join(bytes(page) for page in pages) == b"p" * 2048
        assert all(out is page for out, page in zip(result.outputs, pages, strict=True))

    def test_into_buffers_must_match_the_segments(self, transform: CryptTransform) -> None:
        request = EngineRequest(
            "decrypt", transform, [bytes(1024)], 0, "request", into=[memoryview(bytearray(512))]
        )
        with pytest.raises(ValueError, match="output buffers"):
            self.make_engine().process(request)

    def test_snapshot_counts_requests_and_bytes(self, transform: CryptTransform) -> None:
        engine = self.make_engine()
        engine.process(EngineRequest("encrypt", transform, [bytes(4096)], 0, "bio"))
        engine.process(EngineRequest("decrypt", transform, [bytes(512)], 0, "bio"))
        stats = engine.snapshot()
        assert stats.requests == 2
        assert (stats.bytes_encrypted, stats.bytes_decrypted) == (4096, 512)
        assert stats.bulk_calls + stats.unit_calls >= 2


class TestMeasuredSoftwareEngine(EngineTests):
    def make_engine(self) -> Engine:
        return SimulatedEngine(SOFTWARE)


class TestModelledHardwareEngine(EngineTests):
    def make_engine(self) -> Engine:
        return SimulatedEngine(OMAP_AES_AM335X)


class TestMockEngine(EngineTests):
    def make_engine(self) -> Engine:
        return MockEngine()
