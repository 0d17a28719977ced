"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-22 01:44:24.569060
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("rms", sa.String(length=16), nullable=False),
        sa.Column("rms_job_id", sa.String(length=64), nullable=False),
        sa.Column("site", sa.String(length=64), nullable=False),
        sa.Column("user", sa.String(length=64), nullable=False),
        sa.Column("account", sa.String(length=64), nullable=False),
        sa.Column("job_class", sa.String(length=16), nullable=False),
        sa.Column("os_image", sa.String(length=128), nullable=False),
        sa.Column("nodes", sa.Integer(), nullable=False),
        sa.Column("cores", sa.Integer(), nullable=False),
        sa.Column("memory_mb", sa.Integer(), nullable=False),
        sa.Column("vjob_state", sa.String(length=16), nullable=False),
        sa.Column("preempt_count", sa.Integer(), nullable=False),
        sa.Column("preempted_seconds", sa.Float(), nullable=False),
        sa.Column("preempted_since", sa.Float(), nullable=True),
        sa.Column("submit_at", sa.Float(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.CheckConstraint("job_class IN ('batch','interactive','besteffort')", name=op.f("ck_jobs_job_class")),
        sa.CheckConstraint(
            "vjob_state IN ('waiting','running','sleeping','terminated')", name=op.f("ck_jobs_vjob_state")
        ),
        sa.CheckConstraint("preempt_count >= 0", name=op.f("ck_jobs_preempt_count")),
        sa.CheckConstraint("preempted_seconds >= 0", name=op.f("ck_jobs_preempted_seconds")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("rms", "rms_job_id", name="uq_jobs_rms_job"),
    )
    op.create_table(
        "os_images",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("format", sa.String(length=16), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_os_images")),
        sa.UniqueConstraint("name", "version", name="uq_os_images_name_version"),
    )
    op.create_table(
        "subnets",
        sa.Column("subnet_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("site", sa.String(length=64), nullable=False),
        sa.Column("job_key", sa.String(length=128), nullable=False),
        sa.Column("allocated_at", sa.Float(), nullable=False),
        sa.CheckConstraint("subnet_id >= 0 AND subnet_id < 65536", name=op.f("ck_subnets_subnet_range")),
        sa.PrimaryKeyConstraint("subnet_id", name=op.f("pk_subnets")),
        sa.UniqueConstraint("job_key", name=op.f("uq_subnets_job_key")),
    )
    op.create_table(
        "switches",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("plan_json", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.CheckConstraint(
            "state IN ('planned','running','done','failed','rolled_back')", name=op.f("ck_switches_state")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_switches")),
    )
    op.create_table(
        "targets",
        sa.Column("entity_kind", sa.String(length=8), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("share", sa.Float(), nullable=False),
        sa.CheckConstraint("entity_kind IN ('user','account')", name=op.f("ck_targets_entity_kind")),
        sa.CheckConstraint("share >= 0 AND share <= 1", name=op.f("ck_targets_share")),
        sa.PrimaryKeyConstraint("entity_kind", "name", name=op.f("pk_targets")),
    )
    op.create_table(
        "usage",
        sa.Column("entity_kind", sa.String(length=8), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("node_seconds", sa.Float(), nullable=False),
        sa.Column("decayed_at", sa.Float(), nullable=False),
        sa.CheckConstraint("entity_kind IN ('user','account')", name=op.f("ck_usage_entity_kind")),
        sa.PrimaryKeyConstraint("entity_kind", "name", name=op.f("pk_usage")),
    )
    op.create_table(
        "actions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("switch_id", sa.Integer(), nullable=False),
        sa.Column("pool", sa.Integer(), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("vm_name", sa.String(length=128), nullable=False),
        sa.Column("job_key", sa.String(length=128), nullable=False),
        sa.Column("source", sa.String(length=128), nullable=True),
        sa.Column("destination", sa.String(length=128), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.CheckConstraint("action IN ('run','stop','suspend','resume','migrate')", name=op.f("ck_actions_action")),
        sa.CheckConstraint("state IN ('planned','running','done','failed','undone')", name=op.f("ck_actions_state")),
        sa.ForeignKeyConstraint(
            ["switch_id"], ["switches.id"], name=op.f("fk_actions_switch_id_switches"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_actions")),
    )
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.create_index("ix_actions_switch_id", ["switch_id"], unique=False)

    op.create_table(
        "node_images",
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("image_id", sa.Integer(), nullable=False),
        sa.Column("received_from", sa.String(length=128), nullable=True),
        sa.Column("received_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["image_id"], ["os_images.id"], name=op.f("fk_node_images_image_id_os_images"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("node", "image_id", name=op.f("pk_node_images")),
    )
    op.create_table(
        "snapshots",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("vm_name", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("location_kind", sa.String(length=16), nullable=False),
        sa.Column("location", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.CheckConstraint("kind IN ('memory','disk_overlay','full')", name=op.f("ck_snapshots_kind")),
        sa.CheckConstraint("location_kind IN ('node','repository')", name=op.f("ck_snapshots_location_kind")),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_snapshots_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_snapshots")),
    )
    with op.batch_alter_table("snapshots", schema=None) as batch_op:
        batch_op.create_index("ix_snapshots_job_id", ["job_id"], unique=False)

    op.create_table(
        "vm_ids",
        sa.Column("subnet_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("vm_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("vm_name", sa.String(length=128), nullable=False),
        sa.Column("allocated_at", sa.Float(), nullable=False),
        sa.CheckConstraint("vm_id >= 0 AND vm_id < 256", name=op.f("ck_vm_ids_vm_range")),
        sa.ForeignKeyConstraint(
            ["subnet_id"], ["subnets.subnet_id"], name=op.f("fk_vm_ids_subnet_id_subnets"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("subnet_id", "vm_id", name=op.f("pk_vm_ids")),
        sa.UniqueConstraint("vm_name", name=op.f("uq_vm_ids_vm_name")),
    )
    op.create_table(
        "vms",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=True),
        sa.Column("image", sa.String(length=128), nullable=False),
        sa.Column("vcpus", sa.Integer(), nullable=False),
        sa.Column("memory_mb", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("overlay_path", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.CheckConstraint("state IN ('defined','running','saved','stopped')", name=op.f("ck_vms_state")),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_vms_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_vms")),
        sa.UniqueConstraint("name", name=op.f("uq_vms_name")),
    )
    with op.batch_alter_table("vms", schema=None) as batch_op:
        batch_op.create_index("ix_vms_job_id", ["job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("vms", schema=None) as batch_op:
        batch_op.drop_index("ix_vms_job_id")

    op.drop_table("vms")
    op.drop_table("vm_ids")
    with op.batch_alter_table("snapshots", schema=None) as batch_op:
        batch_op.drop_index("ix_snapshots_job_id")

    op.drop_table("snapshots")
    op.drop_table("node_images")
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.drop_index("ix_actions_switch_id")

    op.drop_table("actions")
    op.drop_table("usage")
    op.drop_table("targets")
    op.drop_table("switches")
    op.drop_table("subnets")
    op.drop_table("os_images")
    op.drop_table("jobs")
