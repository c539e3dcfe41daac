"""device store: file or an RBD image (pool, image)

Revision ID: 4b1e6c2d9a70
Revises: 5b1e0c9d4a21
Create Date: 2026-12-01 12:50:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "4b1e6c2d9a70"
down_revision: str | None = "5b1e0c9d4a21"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("devices", schema=None, recreate="never") as batch_op:
        batch_op.add_column(
            sa.Column("store", sa.String(length=8), server_default="file", nullable=False)
        )
        batch_op.add_column(
            sa.Column(
                "pool", sa.String(length=64), nullable=True, comment="Ceph pool of an rbd device"
            )
        )
        batch_op.add_column(
            sa.Column(
                "image",
                sa.String(length=128),
                nullable=True,
                comment="RBD image of an rbd device",
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("devices", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("image")
        batch_op.drop_column("pool")
        batch_op.drop_column("store")
