"""master key check: one master key per deployment, checked at start

Revision ID: 3e9a7c51d2b8
Revises: 8d3f2a61c5e4
Create Date: 2026-12-01 22:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "3e9a7c51d2b8"
down_revision: str | None = "8d3f2a61c5e4"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "master_key_check",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("value", sa.LargeBinary(length=32), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_master_key_check_one_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_master_key_check")),
    )


def downgrade() -> None:
    op.drop_table("master_key_check")
