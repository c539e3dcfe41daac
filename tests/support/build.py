"""What the wheel and the image are built from."""

from __future__ import annotations

#: What the wheel is built from: the image's build stage copies exactly these.
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "app", "migrations")

#: The lock the image installs every package from, the build backend included: both stages
#: copy it, and nothing is resolved at build time.
IMAGE_LOCK = "requirements/runtime.txt"
