"""Print the distributions installed here that a lock file does not name (besides pip and
reqcrypt itself), for scripts/setup to remove: an install holds what the lock says, no more."""

from __future__ import annotations

import re
import sys
from importlib.metadata import distributions


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_names(lock: str) -> set[str]:
    with open(lock, encoding="utf-8") as lines:
        return {
            normalized(re.split(r"[=<>~!\[ ;]", line, maxsplit=1)[0])
            for line in lines
            if line[:1].isalnum()
        }


def main() -> None:
    keep = locked_names(sys.argv[1]) | {"pip", "reqcrypt"}
    installed = {normalized(dist.metadata["Name"]) for dist in distributions()}
    print(" ".join(sorted(installed - keep)))


if __name__ == "__main__":
    main()
