"""The lock is what an install holds: every package pinned with its hashes, within the
ranges pyproject.toml states, the runtime lock a subset of the dev lock at the same
versions, and this environment exactly the dev lock."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DEV = ROOT / "requirements" / "dev.txt"
RUNTIME = ROOT / "requirements" / "runtime.txt"


def entries(lock: Path) -> dict[str, tuple[str, frozenset[str]]]:
    """Each locked package's version and hashes, by canonical name."""
    locked: dict[str, tuple[str, frozenset[str]]] = {}
    for entry in re.split(r"\n(?=[A-Za-z0-9])", lock.read_text()):
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", entry)
        if match:
            hashes = frozenset(re.findall(r"--hash=sha256:([0-9a-f]{64})", entry))
            locked[canonicalize_name(match[1])] = (match[2], hashes)
    return locked


def test_every_locked_package_has_an_exact_version_and_hashes() -> None:
    for lock in (DEV, RUNTIME):
        requirement_lines = [line for line in lock.read_text().splitlines() if line[:1].isalnum()]
        locked = entries(lock)
        assert len(locked) == len(requirement_lines), f"{lock.name}: a line is not NAME==VERSION"
        unhashed = [name for name, (_, hashes) in locked.items() if not hashes]
        assert unhashed == [], f"{lock.name}: no hash for {unhashed}"


def test_the_runtime_lock_pins_the_dev_locks_versions_and_hashes() -> None:
    dev, runtime = entries(DEV), entries(RUNTIME)
    differing = {name: pin for name, pin in runtime.items() if dev.get(name) != pin}
    assert differing == {}


def test_the_lock_satisfies_every_range_pyproject_states() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    stated = [
        *project["build-system"]["requires"],
        *project["project"]["dependencies"],
        *project["project"]["optional-dependencies"]["dev"],
    ]
    locked = entries(DEV)
    outside = []
    for text in stated:
        requirement = Requirement(text)
        pin = locked.get(canonicalize_name(requirement.name))
        if pin is None or not requirement.specifier.contains(pin[0], prereleases=True):
            outside.append(f"{text}: locked {pin[0] if pin else 'nothing'}")
    assert outside == [], "re-lock with scripts/lock"


def test_this_environment_holds_exactly_the_dev_lock() -> None:
    """What scripts/setup installed: the lock's versions, nothing more (pip and reqcrypt
    itself aside), nothing less."""
    installed = {canonicalize_name(dist.metadata["Name"]): dist.version for dist in distributions()}
    installed.pop("pip", None)
    installed.pop("reqcrypt", None)
    locked = {name: version for name, (version, _) in entries(DEV).items()}
    assert installed == locked
