"""Key material the tests write into tables: fixed, so a failure reproduces."""

from __future__ import annotations

XTS_KEY = bytes(range(64)).hex()
"""aes-xts-plain64: two AES-256 halves."""
CBC_KEY = bytes(range(32)).hex()
"""aes-cbc-essiv:sha256: one AES-256 key."""
