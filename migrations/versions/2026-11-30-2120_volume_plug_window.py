"""volume plug window

Revision ID: 35f943614198
Revises: 79d55020ccb7
Create Date: 2026-11-30 21:20:14.700404
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "35f943614198"
down_revision: str | None = "79d55020ccb7"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("volumes", schema=None, recreate="never") as batch_op:
        batch_op.add_column(
            sa.Column(
                "plug_window_us", sa.Integer(), nullable=True, comment="NULL: the service default"
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("volumes", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("plug_window_us")
