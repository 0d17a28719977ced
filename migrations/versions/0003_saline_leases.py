"""saline leases: one site master acts on a best-effort vjob at a time

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24 06:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("saline_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("lease_owner", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("lease_expires_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("saline_jobs", schema=None) as batch_op:
        batch_op.drop_column("lease_expires_at")
        batch_op.drop_column("lease_owner")
