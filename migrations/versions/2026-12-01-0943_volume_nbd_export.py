"""volume nbd export

Revision ID: 7cf77245dcdb
Revises: 35f943614198
Create Date: 2026-12-01 09:43:49.005228
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "7cf77245dcdb"
down_revision: str | None = "35f943614198"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("volumes", schema=None, recreate="never") as batch_op:
        batch_op.add_column(
            sa.Column("nbd_export", sa.Boolean(), server_default=sa.false(), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("volumes", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("nbd_export")
