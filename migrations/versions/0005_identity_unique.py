"""identity uniqueness: a VM's identity row names its job, sits in that job's subnet, MAC unique

Revision ID: 0005
Revises: 0004 (0004_agent_leases)
Create Date: 2026-11-24 07:00:00.000000

Why: a vmID inserted with a stale subnetID landed in the subnet another job had been given
meanwhile (issue 23, item 7). vm_ids now carries job_key with a foreign key on
(subnet_id, job_key), so the database itself refuses a VM in another job's subnet, and the
MAC fixed at allocation is unique. Existing rows get their job's key; their MAC stays NULL
until the next assign of their job fills it. (Planned as 0004; 0004 went to the agent leases.)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A unique index (not a constraint): on SQLite this needs no rebuild of `subnets`, whose
    # DROP TABLE would cascade-delete every vm_ids row.
    op.create_index("uq_subnets_subnet_job", "subnets", ["subnet_id", "job_key"], unique=True)
    with op.batch_alter_table("vm_ids", schema=None) as batch_op:
        batch_op.add_column(sa.Column("job_key", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("mac", sa.String(length=17), nullable=True))
    op.execute(
        "UPDATE vm_ids SET job_key = (SELECT subnets.job_key FROM subnets WHERE subnets.subnet_id = vm_ids.subnet_id)"
    )
    op.execute("DELETE FROM vm_ids WHERE job_key IS NULL")  # no subnet: freed already
    with op.batch_alter_table("vm_ids", schema=None) as batch_op:
        batch_op.alter_column("job_key", existing_type=sa.String(length=128), nullable=False)
        batch_op.drop_constraint("fk_vm_ids_subnet_id_subnets", type_="foreignkey")
        batch_op.create_foreign_key(
            "fk_vm_ids_subnet_job_subnets",
            "subnets",
            ["subnet_id", "job_key"],
            ["subnet_id", "job_key"],
            ondelete="CASCADE",
        )
        batch_op.create_unique_constraint(batch_op.f("uq_vm_ids_mac"), ["mac"])


def downgrade() -> None:
    with op.batch_alter_table("vm_ids", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("uq_vm_ids_mac"), type_="unique")
        batch_op.drop_constraint("fk_vm_ids_subnet_job_subnets", type_="foreignkey")
        batch_op.create_foreign_key(
            batch_op.f("fk_vm_ids_subnet_id_subnets"), "subnets", ["subnet_id"], ["subnet_id"], ondelete="CASCADE"
        )
        batch_op.drop_column("mac")
        batch_op.drop_column("job_key")
    op.drop_index("uq_subnets_subnet_job", table_name="subnets")
