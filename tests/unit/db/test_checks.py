"""What the database checks refuse, and the one line each says."""

from __future__ import annotations

from app.db.checks import MIN_POSTGRES, MIN_SQLITE, postgres_problem, sqlite_problem


def test_a_utf8_postgresql_at_the_minimum_version_passes() -> None:
    assert postgres_problem("UTF8", MIN_POSTGRES, "reqcrypt") is None


def test_another_encoding_is_refused_naming_the_fix() -> None:
    problem = postgres_problem("SQL_ASCII", MIN_POSTGRES, "reqcrypt")
    assert problem is not None
    assert "encoding SQL_ASCII" in problem
    assert "CREATE DATABASE reqcrypt ENCODING 'UTF8' TEMPLATE template0" in problem
    assert "\n" not in problem


def test_a_postgresql_older_than_the_minimum_is_refused() -> None:
    older = MIN_POSTGRES - 10000
    problem = postgres_problem("UTF8", older, "reqcrypt")
    assert problem == (
        f"PostgreSQL {older // 10000} is too old: reqcrypt needs {MIN_POSTGRES // 10000} or newer"
    )


def test_sqlite_older_than_the_minimum_is_refused() -> None:
    older = (MIN_SQLITE[0], MIN_SQLITE[1] - 1, 0)
    problem = sqlite_problem(older)
    assert problem is not None
    assert problem.startswith(f"SQLite {older[0]}.{older[1]}.0 is too old")
    assert sqlite_problem(MIN_SQLITE) is None
