"""Alembic's script directory, installed as ``app.migrations`` (see setup.py) so a wheel migrates."""
