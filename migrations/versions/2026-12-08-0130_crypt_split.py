"""crypt split: a volume's dm-crypt max_read_size / max_write_size

Revision ID: 5c2f8e1a7d93
Revises: 3e9a7c51d2b8
Create Date: 2026-12-08 01:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5c2f8e1a7d93"
down_revision: str | None = "3e9a7c51d2b8"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("volumes", schema=None, recreate="never") as batch_op:
        batch_op.add_column(
            sa.Column(
                "max_read_size",
                sa.Integer(),
                nullable=True,
                comment="dm-crypt's split of reads, bytes; NULL: the service default",
            )
        )
        batch_op.add_column(
            sa.Column(
                "max_write_size",
                sa.Integer(),
                nullable=True,
                comment="dm-crypt's split of writes, bytes; NULL: the service default",
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("volumes", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("max_write_size")
        batch_op.drop_column("max_read_size")
