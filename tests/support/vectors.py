"""Published test vectors (tests/unit/crypto/vectors) and the kernel fixtures' byte streams,
which the NBD client tests and the guest benchmark also write."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

VECTORS = Path(__file__).resolve().parents[1] / "unit" / "crypto" / "vectors"


def load_vectors(name: str) -> dict[str, Any]:
    return json.loads((VECTORS / name).read_text())


FIXTURES = load_vectors("kernel_fixtures.json")
CASES: dict[str, dict[str, Any]] = {case["name"]: case for case in FIXTURES["cases"]}


def stream(seed: str, size: int) -> bytes:
    """The fixtures' byte stream: sha256(seed || le64(i)) blocks, concatenated, truncated."""
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(seed.encode() + counter.to_bytes(8, "little")).digest()
        counter += 1
    return bytes(out[:size])
