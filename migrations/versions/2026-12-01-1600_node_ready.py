"""node ready: placement picks only nodes that can serve every store

Revision ID: 8d3f2a61c5e4
Revises: 4b1e6c2d9a70
Create Date: 2026-12-01 16:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "8d3f2a61c5e4"
down_revision: str | None = "4b1e6c2d9a70"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None, recreate="never") as batch_op:
        batch_op.add_column(
            sa.Column(
                "ready",
                sa.Boolean(),
                server_default=sa.true(),
                nullable=False,
                comment="written with each heartbeat; false: fenced or stopping, place nothing here",
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("ready")
