"""The test tree's own rule: a test module is imported by pytest alone, so helpers that
several modules need live in ``tests/support`` (or a package's conftest), never in a
``test_*.py`` another module imports."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_test_modules(source: str, package: tuple[str, ...]) -> set[str]:
    """The ``test_*`` modules that ``source`` (a module of ``package``) imports from,
    relative imports resolved."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return {name for name in names if name.rsplit(".", 1)[-1].startswith("test_")}


def test_no_module_imports_a_test_module() -> None:
    offenders = {
        f"{path.relative_to(TESTS.parent)} imports {name}"
        for path in sorted(TESTS.rglob("*.py"))
        for name in imported_test_modules(
            path.read_text(), path.relative_to(TESTS.parent).with_suffix("").parts[:-1]
        )
    }
    assert not offenders, sorted(offenders)


def test_the_rule_sees_absolute_and_relative_imports_of_test_modules() -> None:
    source = (
        "from tests.integration.test_e2e_data import Server\n"
        "from .test_volume import SECTORS\n"
        "from . import test_stacking\n"
        "from tests.support.servers import Server\n"
        "from .helpers import write_bio\n"
    )
    assert imported_test_modules(source, ("tests", "unit", "dm")) == {
        "tests.integration.test_e2e_data",
        "tests.unit.dm.test_volume",
        "tests.unit.dm.test_stacking",
    }


def test_unit_test_packages_mirror_app() -> None:
    """A unit test package is named after the ``app`` package it tests, so the tests of
    a module are found where the module is."""
    app = TESTS.parent / "app"
    unit = TESTS / "unit"
    strays = [
        str(package.relative_to(unit))
        for package in sorted(path.parent for path in unit.rglob("__init__.py"))
        if package != unit and not (app / package.relative_to(unit)).is_dir()
    ]
    assert not strays, strays
