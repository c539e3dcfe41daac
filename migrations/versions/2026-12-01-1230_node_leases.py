"""node leases

Revision ID: 5b1e0c9d4a21
Revises: 7cf77245dcdb
Create Date: 2026-12-01 12:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5b1e0c9d4a21"
down_revision: str | None = "7cf77245dcdb"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("url", sa.String(length=512), nullable=False),
        sa.Column(
            "heartbeat_at",
            sa.DateTime(timezone=True),
            nullable=False,
            comment="the database's clock",
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nodes")),
    )
    with op.batch_alter_table("volumes", schema=None, recreate="never") as batch_op:
        batch_op.add_column(
            sa.Column(
                "owner_node",
                sa.String(length=64),
                nullable=True,
                comment="the node holding the lease (a cluster); NULL: nobody",
            )
        )
        batch_op.add_column(
            sa.Column(
                "lease_expires_at",
                sa.DateTime(timezone=True),
                nullable=True,
                comment="the database's clock; past it another node may take the volume",
            )
        )
        batch_op.add_column(
            sa.Column(
                "lease_epoch",
                sa.Integer(),
                server_default="0",
                nullable=False,
                comment="incremented at every takeover",
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("volumes", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("lease_epoch")
        batch_op.drop_column("lease_expires_at")
        batch_op.drop_column("owner_node")
    op.drop_table("nodes")
