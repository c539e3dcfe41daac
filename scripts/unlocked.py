"""Print the distributions installed here that a lock file does not name (besides pip and
reqcrypt itself), for scripts/setup to remove: an install holds what the lock says, no more."""

from __future__ import annotations

import sys
from importlib.metadata import distributions

from packaging.utils import canonicalize_name


def locked_names(lock: str) -> set[str]:
    """The names a pip-compile lock pins (``NAME==VERSION \\`` lines)."""
    with open(lock, encoding="utf-8") as lines:
        return {canonicalize_name(line.split("==", 1)[0]) for line in lines if line[:1].isalnum()}


def main() -> None:
    keep = locked_names(sys.argv[1]) | {"pip", "reqcrypt"}
    installed = {canonicalize_name(dist.metadata["Name"]) for dist in distributions()}
    print(" ".join(sorted(installed - keep)))


if __name__ == "__main__":
    main()
