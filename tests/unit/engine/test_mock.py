"""``MockEngine``: scripted answers, recorded requests, counters like a real engine's."""

from __future__ import annotations

import os

from app.crypto.keys import KeyMaterial
from app.crypto.spec import parse_cipher_spec
from app.crypto.transform import make_transform
from app.engine.base import EngineRequest
from app.engine.mock import MockEngine


def test_the_default_answer_is_the_real_bytes_with_per_unit_calls() -> None:
    spec = parse_cipher_spec("aes-cbc-essiv:sha256")
    transform = make_transform(spec, KeyMaterial(os.urandom(32)))
    engine = MockEngine()
    plain = os.urandom(2048)
    sealed = engine.process(EngineRequest("encrypt", transform, [plain], 8, "request"))
    assert b"".join(bytes(out) for out in sealed.outputs) == transform.encrypt(plain, 8)
    opened = engine.process(EngineRequest("decrypt", transform, sealed.outputs, 8, "bio"))
    assert bytes(opened.outputs[0]) == plain
    assert [request.op for request in engine.requests] == ["encrypt", "decrypt"]
    stats = engine.snapshot()
    assert (stats.requests, stats.unit_calls, stats.bulk_calls) == (2, 8, 0)
    assert (stats.bytes_encrypted, stats.bytes_decrypted) == (2048, 2048)
