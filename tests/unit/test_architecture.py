"""Dependencies point downward, for every package and top-level module under ``app``.

``ALLOWED`` lists, for each unit, the ``app`` units it may import; a unit
missing from it fails the suite, so a new package has to be placed in the
layering. ``NO_WEB`` and ``NO_SQL`` name the units that must not import the
web or SQL frameworks: the core knows neither HTTP nor SQL.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[2] / "app"

LEAVES = {"vocab", "errors", "config", "sizes", "integers"}
CORE = {"crypto", "blk", "engine", "storage", "luks"}

ALLOWED: dict[str, set[str]] = {
    "vocab": set(),
    "errors": set(),
    "config": set(),
    "integers": set(),
    "crypto": {"errors", "vocab"},
    "blk": {"errors", "vocab"},
    "engine": {"errors", "integers", "vocab"},
    "storage": {"errors", "vocab"},
    "luks": {"crypto", "errors"},
    # records: the control plane's rows, tables parsed and keys wrapped on the way
    "db": {"blk", "config", "crypto", "dm", "errors", "vocab"},
    "dm": {"blk", "crypto", "engine", "errors", "vocab"},
    # the one I/O layer under every front end
    "io": {"dm", "errors", "vocab"},
    # cluster → control → db: control states the ownership guard it needs and never
    # imports the cluster that implements it; db knows neither
    "control": {"blk", "config", "db", "dm", "engine", "errors", "storage", "vocab"},
    # leases and owners through db; dm for the (pure) stacking order; storage: the
    # serving set claims the devices of the volumes it serves
    "cluster": {"config", "control", "db", "dm", "errors", "storage"},
    "bench": {
        "blk",
        "config",
        "control",
        "db",
        "dm",
        "engine",
        "errors",
        "sizes",
        "vocab",
        "commands",  # `bench http` finds the service and token as every client command does
        "main",  # `reqcrypt bench` builds the service's state in process
        "startup",  # in-process runs load settings and refuse to start as every command does
    },
    "metrics": {"cluster", "control", "io", "nbd"},
    "nbd": {"blk", "config", "control", "dm", "errors", "io", "vocab"},
    "keyfiles": {"config"},
    "state": {"bench", "cluster", "config", "control", "engine", "io", "nbd"},
    "api": {
        "bench",
        "blk",
        "config",
        "control",
        "db",
        "dm",
        "engine",
        "errors",
        "integers",
        "io",
        "luks",  # LUKS headers: the crypt table a passphrase unlocks
        "vocab",
        "state",  # the lifespan's typed State
        "cluster",  # the routing middleware adapts cluster.routing and cluster.relay
        "nbd",  # volume info and status list the NBD connections
    },
    "main": {
        "api",
        "bench",
        "cluster",
        "config",
        "control",
        "db",
        "engine",
        "io",
        "keyfiles",
        "metrics",
        "nbd",
        "state",
        "storage",
    },
    "sizes": {"errors"},
    # `trace --summary` reads blkparse text with app.blk.trace (pure text, no queue)
    "commands": {"blk", "config", "errors", "sizes"},
    "dmsetup": {"commands", "config"},
    # an in-process command's settings and refusals to start (database, key, data directory)
    "startup": {"commands", "config", "db", "keyfiles"},
    "cli": {"bench", "commands", "config", "db", "dmsetup", "io", "keyfiles", "main", "startup"},
}
WEB = {"fastapi", "starlette"}
SQL = {"sqlalchemy", "alembic"}
NO_WEB = LEAVES | CORE | {"dm", "io", "db", "control", "cluster", "bench", "nbd"}
NO_SQL = LEAVES | CORE | {"dm", "io", "control", "cluster", "nbd"}


def units() -> list[str]:
    """Every package and top-level module under ``app`` (``_native`` is C)."""
    names = {path.stem for path in APP.glob("*.py") if path.stem != "__init__"}
    names |= {path.parent.name for path in APP.glob("*/__init__.py")}
    return sorted(names)


def files_of(unit: str) -> list[Path]:
    package = APP / unit
    return sorted(package.rglob("*.py")) if package.is_dir() else [APP / f"{unit}.py"]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            if node.module == "app":
                names.update(f"app.{alias.name}" for alias in node.names)
    return names


def test_every_unit_is_placed_in_the_layering() -> None:
    assert sorted(set(units()) - {"_native"}) == sorted(ALLOWED)


@pytest.mark.parametrize("unit", sorted(ALLOWED))
def test_imports_point_downward(unit: str) -> None:
    offending = []
    for path in files_of(unit):
        for module in imported_modules(path):
            parts = module.split(".")
            top = parts[0]
            inner = parts[1] if top == "app" and len(parts) > 1 else None
            if inner is not None and inner != unit and inner not in ALLOWED[unit] | {"_native"}:
                offending.append(f"{path.relative_to(APP)} imports {module}")
            if unit in NO_WEB and top in WEB:
                offending.append(f"{path.relative_to(APP)} imports {module} (web)")
            if unit in NO_SQL and top in SQL:
                offending.append(f"{path.relative_to(APP)} imports {module} (SQL)")
    assert offending == []


def reachable(unit: str) -> set[str]:
    """Every unit ``unit`` may import, directly or through the units it may import."""
    seen: set[str] = set()
    waiting = [unit]
    while waiting:
        for lower in ALLOWED[waiting.pop()] - seen:
            seen.add(lower)
            waiting.append(lower)
    return seen


DIRECTIONS = [("api", "io"), ("nbd", "io"), ("io", "dm"), ("cluster", "control"), ("control", "db")]
"""The data path (front ends → the I/O layer → the volume) and ownership (cluster →
control → records): each upper unit uses the lower one, which never reaches back."""


@pytest.mark.parametrize(("upper", "lower"), DIRECTIONS)
def test_the_data_path_and_ownership_point_one_way(upper: str, lower: str) -> None:
    assert lower in ALLOWED[upper]
    assert upper not in reachable(lower)


def test_nothing_but_main_imports_the_http_front_end() -> None:
    assert sorted(unit for unit, allowed in ALLOWED.items() if "api" in allowed) == ["main"]


def test_front_ends_reach_the_data_path_only_through_the_io_layer() -> None:
    """The batch API is ``io``'s way into a volume: no front end drives ``DataPath`` itself."""
    offending = [
        f"{path.relative_to(APP)} imports {module}"
        for unit in ("api", "nbd")
        for path in files_of(unit)
        for module in imported_modules(path)
        if module == "app.dm.datapath"
    ]
    assert offending == []


def test_the_vocabulary_is_a_leaf() -> None:
    assert not [m for m in imported_modules(APP / "vocab.py") if m.split(".")[0] == "app"]


def test_a_forbidden_import_is_caught(tmp_path: Path) -> None:
    """The walker sees ``from app import x`` and function-level imports, not just the top."""
    source = tmp_path / "probe.py"
    source.write_text("def f():\n    from app import control\n    import sqlalchemy.orm\n")
    assert imported_modules(source) >= {"app", "app.control", "sqlalchemy.orm"}
