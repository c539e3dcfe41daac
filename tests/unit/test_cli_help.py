"""Every command's help: placeholders, a description per parameter, plain text."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from app.cli import cli, use_placeholders


def command_paths() -> Iterator[list[str]]:
    root = get_command(cli)

    def walk(command: object, path: list[str]) -> Iterator[list[str]]:
        yield path
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, name])

    yield from walk(root, [])


PATHS = list(command_paths())


def help_of(path: list[str]) -> str:
    result = CliRunner().invoke(
        cli, [*path, "--help"], env={"COLUMNS": "200"}, prog_name="reqcrypt"
    )
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("path", PATHS, ids=[" ".join(p) or "reqcrypt" for p in PATHS])
def test_help_shows_placeholders_not_types_or_markup(path: list[str]) -> None:
    text = help_of(path)
    assert re.search(r"<(bool|int|float|str|path)>", text) is None
    assert "{" not in usage_line(text)
    assert "``" not in text
    assert "DESIGN.md" not in text


def usage_line(text: str) -> str:
    return next(line for line in text.splitlines() if "Usage:" in line)


def test_every_parameter_is_described() -> None:
    root = get_command(cli)
    use_placeholders(root)
    undescribed = []

    def walk(command: object, path: str) -> None:
        for param in getattr(command, "params", []):
            if not getattr(param, "help", None):
                undescribed.append(f"{path} {param.name}")
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(root, "reqcrypt")
    assert undescribed == []


def test_a_size_argument_takes_fractions_and_binary_suffixes() -> None:
    text = help_of(["dev", "create"])
    assert "Usage: reqcrypt dev create [OPTIONS] NAME SIZE" in text
    assert "1.5G" in text


def test_a_size_that_is_not_whole_bytes_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["dev", "create", "odd", "1.3k"], prog_name="reqcrypt")
    assert result.exit_code == 2
    assert result.output == (
        "reqcrypt: dev create: Invalid value for 'SIZE': size '1.3k': not a whole number of "
        "bytes (see reqcrypt dev create --help)\n"
    )


def test_version_is_the_installed_distributions() -> None:
    from importlib.metadata import version

    result = CliRunner().invoke(cli, ["--version"], prog_name="reqcrypt")
    assert result.exit_code == 0
    assert result.stdout == f"reqcrypt {version('reqcrypt')}\n"
