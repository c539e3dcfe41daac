"""Alembic revisions (a package so setuptools installs them; Alembic skips this file)."""
