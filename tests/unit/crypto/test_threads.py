"""One transform serves every request of a volume, from many threads at once."""

from __future__ import annotations

import os
import threading

import pytest

from app.crypto.keys import KeyMaterial
from app.crypto.spec import parse_cipher_spec
from app.crypto.transform import make_transform


@pytest.mark.parametrize(
    "spec_text", ["aes-cbc-essiv:sha256", "aes-cbc-eboiv", "aes-xts-plain64", "aes-cbc-plain64"]
)
def test_concurrent_requests_on_one_transform_match_the_reference(spec_text: str) -> None:
    spec = parse_cipher_spec(spec_text)
    key = KeyMaterial(os.urandom(64 if "xts" in spec_text else 32))
    shared = make_transform(spec, key, impl="bulk")
    reference = make_transform(spec, key, impl="reference")
    data = os.urandom(4 << 20)
    expected = reference.encrypt(data, 8)
    failures: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(6):
                assert shared.encrypt(data, 8) == expected
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
