"""Dependencies point downward: the core packages import neither FastAPI nor SQLAlchemy."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[2] / "app"

# package -> app packages it must never import (beyond the web and SQL frameworks)
FORBIDDEN: dict[str, set[str]] = {
    "crypto": {"api", "dm", "blk", "engine", "storage", "db", "bench", "control"},
    "blk": {"api", "dm", "engine", "crypto", "storage", "db", "bench", "control"},
    "engine": {"api", "dm", "blk", "storage", "db", "bench", "control"},
    "storage": {"api", "dm", "blk", "engine", "crypto", "db", "bench", "control"},
    "dm": {"api", "db", "bench", "control"},
    "nbd": {"api", "db", "bench"},
}
FRAMEWORKS = {"fastapi", "starlette", "sqlalchemy", "alembic"}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_core_package_imports_point_downward(package: str) -> None:
    offending = []
    for path in sorted((APP / package).rglob("*.py")):
        for module in imported_modules(path):
            top = module.split(".")[0]
            inner = module.split(".")[1] if module.startswith("app.") else None
            if top in FRAMEWORKS or inner in FORBIDDEN[package]:
                offending.append(f"{path.relative_to(APP)} imports {module}")
    assert offending == []
