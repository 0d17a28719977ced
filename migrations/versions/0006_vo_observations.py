"""vo observations: finished vjobs' predicted and actual run times, for the online VO model

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25 21:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "vo_observations",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=True),
        sa.Column("colocated", sa.Integer(), nullable=False),
        sa.Column("walltime_s", sa.Float(), nullable=False),
        sa.Column("predicted_s", sa.Float(), nullable=False),
        sa.Column("actual_s", sa.Float(), nullable=False),
        sa.CheckConstraint("colocated >= 0", name=op.f("ck_vo_observations_colocated")),
        sa.CheckConstraint(
            "walltime_s > 0 AND actual_s > 0 AND predicted_s > 0", name=op.f("ck_vo_observations_durations")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_vo_observations")),
        sa.UniqueConstraint("job_id", "finished_at", name=op.f("uq_vo_observations_job_id")),
    )


def downgrade() -> None:
    op.drop_table("vo_observations")
