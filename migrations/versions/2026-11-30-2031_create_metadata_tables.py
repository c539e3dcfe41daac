"""create metadata tables

Revision ID: 79d55020ccb7
Revises:
Create Date: 2026-11-30 20:31:55.971395
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "79d55020ccb7"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "benchmark_runs",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("progress", sa.Double(), nullable=False),
        sa.Column("results", sa.JSON(), nullable=False),
        sa.Column("machine", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_benchmark_runs")),
    )
    op.create_table(
        "device_models",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_device_models")),
        sa.UniqueConstraint("name", name=op.f("uq_device_models_name")),
    )
    op.create_table(
        "devices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("model", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_devices")),
        sa.UniqueConstraint("name", name=op.f("uq_devices_name")),
    )
    op.create_table(
        "engine_profiles",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("profile", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_engine_profiles")),
        sa.UniqueConstraint("name", name=op.f("uq_engine_profiles_name")),
    )
    op.create_table(
        "volumes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("uuid", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("dispatch_mode", sa.String(length=16), nullable=False),
        sa.Column("engine", sa.String(length=64), nullable=False),
        sa.Column("elevator", sa.String(length=16), nullable=False),
        sa.Column("queue_limits", sa.JSON(), nullable=False),
        sa.Column("event_nr", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_volumes")),
        sa.UniqueConstraint("name", name=op.f("uq_volumes_name")),
        sa.UniqueConstraint("uuid", name=op.f("uq_volumes_uuid")),
    )
    op.create_table(
        "volume_tables",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("volume_id", sa.Integer(), nullable=False),
        sa.Column("slot", sa.String(length=16), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["volume_id"],
            ["volumes.id"],
            name=op.f("fk_volume_tables_volume_id_volumes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_volume_tables")),
        sa.UniqueConstraint("volume_id", "slot", name=op.f("uq_volume_tables_volume_id")),
    )
    op.create_table(
        "wrapped_keys",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("table_id", sa.Integer(), nullable=False),
        sa.Column("line_index", sa.Integer(), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["table_id"],
            ["volume_tables.id"],
            name=op.f("fk_wrapped_keys_table_id_volume_tables"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_wrapped_keys")),
        sa.UniqueConstraint("table_id", "line_index", name=op.f("uq_wrapped_keys_table_id")),
    )


def downgrade() -> None:
    op.drop_table("wrapped_keys")
    op.drop_table("volume_tables")
    op.drop_table("volumes")
    op.drop_table("engine_profiles")
    op.drop_table("devices")
    op.drop_table("device_models")
    op.drop_table("benchmark_runs")
