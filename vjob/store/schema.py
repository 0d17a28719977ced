"""The state store's tables (SQLAlchemy 2, typed declarative mapping).

Why these tables: vjob must survive its own crashes. Everything it cannot re-observe from the
RMS or libvirt lives here: the preemption history (Pn, Pt) the UBIS priority needs, where each
VM and snapshot is, which node holds which OS image (and who it got it from: the routing table
of the image tree), decayed usage, Saline's network identities, and a journal of every VM
action so that a context switch cut in half can be finished or undone.

Timestamps are POSIX seconds (Float), as in the domain model, so the simulator and the agent
share arithmetic and SQLite and PostgreSQL store the same thing.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class JobRecord(Base):
    """A job vjob tracks, keyed by its RMS and the id it has there."""

    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("rms", "rms_job_id", name="uq_jobs_rms_job"),
        CheckConstraint("job_class IN ('batch','interactive','besteffort')", name="job_class"),
        CheckConstraint("vjob_state IN ('waiting','running','sleeping','terminated')", name="vjob_state"),
        CheckConstraint("preempt_count >= 0", name="preempt_count"),
        CheckConstraint("preempted_seconds >= 0", name="preempted_seconds"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    rms: Mapped[str] = mapped_column(String(16))
    rms_job_id: Mapped[str] = mapped_column(String(64))
    site: Mapped[str] = mapped_column(String(64), default="default")
    user: Mapped[str] = mapped_column(String(64))
    account: Mapped[str] = mapped_column(String(64), default="")
    job_class: Mapped[str] = mapped_column(String(16), default="batch")
    os_image: Mapped[str] = mapped_column(String(128), default="")
    nodes: Mapped[int] = mapped_column(Integer, default=1)
    cores: Mapped[int] = mapped_column(Integer, default=1)
    memory_mb: Mapped[int] = mapped_column(Integer, default=1024)
    vjob_state: Mapped[str] = mapped_column(String(16), default="waiting")
    preempt_count: Mapped[int] = mapped_column(Integer, default=0)
    preempted_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    preempted_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    submit_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class VMRecord(Base):
    """One VM of a vjob and its current placement."""

    __tablename__ = "vms"
    __table_args__ = (
        CheckConstraint("state IN ('defined','running','saved','stopped')", name="state"),
        Index("ix_vms_job_id", "job_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    node: Mapped[str | None] = mapped_column(String(128), nullable=True)
    image: Mapped[str] = mapped_column(String(128))
    vcpus: Mapped[int] = mapped_column(Integer, default=1)
    memory_mb: Mapped[int] = mapped_column(Integer, default=512)
    state: Mapped[str] = mapped_column(String(16), default="defined")
    overlay_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class SnapshotRecord(Base):
    """A saved VM state: memory, disk overlay or both, and where the file lies."""

    __tablename__ = "snapshots"
    __table_args__ = (
        CheckConstraint("kind IN ('memory','disk_overlay','full')", name="kind"),
        CheckConstraint("location_kind IN ('node','repository')", name="location_kind"),
        Index("ix_snapshots_job_id", "job_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    vm_name: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(16))
    path: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    location_kind: Mapped[str] = mapped_column(String(16))
    location: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[float] = mapped_column(Float)


class ImageRecord(Base):
    """An OS image of the catalogue (UBIS: the OS a job asks for)."""

    __tablename__ = "os_images"
    __table_args__ = (UniqueConstraint("name", "version", name="uq_os_images_name_version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128))
    version: Mapped[str] = mapped_column(String(64), default="1")
    format: Mapped[str] = mapped_column(String(16), default="qcow2")
    path: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)


class NodeImageRecord(Base):
    """Which node holds which image, and from whom it received it (the tree's routing table)."""

    __tablename__ = "node_images"

    node: Mapped[str] = mapped_column(String(128), primary_key=True)
    image_id: Mapped[int] = mapped_column(ForeignKey("os_images.id", ondelete="CASCADE"), primary_key=True)
    received_from: Mapped[str | None] = mapped_column(String(128), nullable=True)
    received_at: Mapped[float] = mapped_column(Float)


class UsageRecord(Base):
    """Decayed usage (node-seconds) of a user or an account, for the UBIS Target−Usage term."""

    __tablename__ = "usage"
    __table_args__ = (CheckConstraint("entity_kind IN ('user','account')", name="entity_kind"),)

    entity_kind: Mapped[str] = mapped_column(String(8), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    node_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    decayed_at: Mapped[float] = mapped_column(Float)


class TargetRecord(Base):
    """A target share (0..1) of a user or an account."""

    __tablename__ = "targets"
    __table_args__ = (
        CheckConstraint("entity_kind IN ('user','account')", name="entity_kind"),
        CheckConstraint("share >= 0 AND share <= 1", name="share"),
    )

    entity_kind: Mapped[str] = mapped_column(String(8), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    share: Mapped[float] = mapped_column(Float)


class SubnetRecord(Base):
    """A Saline subnetID (16 bits), unique across all sites, held by one job."""

    __tablename__ = "subnets"
    __table_args__ = (
        CheckConstraint("subnet_id >= 0 AND subnet_id < 65536", name="subnet_range"),
        # The target of vm_ids' (subnet_id, job_key) foreign key (vjob.store.identities). An
        # index, not a table constraint: SQLite adds it without rebuilding `subnets` (a rebuild
        # is a DROP TABLE, whose implicit DELETE would cascade to every vm_ids row).
        Index("uq_subnets_subnet_job", "subnet_id", "job_key", unique=True),
    )

    subnet_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    site: Mapped[str] = mapped_column(String(64))
    job_key: Mapped[str] = mapped_column(String(128), unique=True)
    allocated_at: Mapped[float] = mapped_column(Float)


class VMIdRecord(Base):
    """A Saline vmID (8 bits) inside a subnet, held by one VM."""

    __tablename__ = "vm_ids"
    __table_args__ = (
        CheckConstraint("vm_id >= 0 AND vm_id < 256", name="vm_range"),
        # A VM sits only in its own job's subnet, and goes when that subnet is released.
        ForeignKeyConstraint(
            ["subnet_id", "job_key"],
            ["subnets.subnet_id", "subnets.job_key"],
            name="fk_vm_ids_subnet_job_subnets",
            ondelete="CASCADE",
        ),
    )

    subnet_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    vm_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    vm_name: Mapped[str] = mapped_column(String(128), unique=True)
    job_key: Mapped[str] = mapped_column(String(128))
    mac: Mapped[str | None] = mapped_column(String(17), unique=True, nullable=True)
    """prefix:subnet:subnet:vm, fixed at allocation; NULL only for rows older than schema 0004."""
    allocated_at: Mapped[float] = mapped_column(Float)


class SwitchRecord(Base):
    """One context switch (a plan being carried out), the unit of crash recovery."""

    __tablename__ = "switches"
    __table_args__ = (CheckConstraint("state IN ('planned','running','done','failed','rolled_back')", name="state"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    state: Mapped[str] = mapped_column(String(16), default="planned")
    plan_json: Mapped[str] = mapped_column(Text, default="{}")
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class ActionRecord(Base):
    """One VM action of a switch, journalled before it runs and updated after."""

    __tablename__ = "actions"
    __table_args__ = (
        CheckConstraint("action IN ('run','stop','suspend','resume','migrate')", name="action"),
        CheckConstraint("state IN ('planned','running','done','failed','undone')", name="state"),
        Index("ix_actions_switch_id", "switch_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    switch_id: Mapped[int] = mapped_column(ForeignKey("switches.id", ondelete="CASCADE"))
    pool: Mapped[int] = mapped_column(Integer)
    action: Mapped[str] = mapped_column(String(16))
    vm_name: Mapped[str] = mapped_column(String(128))
    job_key: Mapped[str] = mapped_column(String(128), default="")
    source: Mapped[str | None] = mapped_column(String(128), nullable=True)
    destination: Mapped[str | None] = mapped_column(String(128), nullable=True)
    state: Mapped[str] = mapped_column(String(16), default="planned")
    error: Mapped[str] = mapped_column(Text, default="")
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class SalineJobRecord(Base):
    """A Saline best-effort vjob: what to run, where it is now, and what it survived.

    Why a row of its own: the OAR job id changes at every resubmission and the site may
    change too, while the vjob (its key, VMs, network identity, snapshots) stays the same.
    """

    __tablename__ = "saline_jobs"
    __table_args__ = (
        CheckConstraint("phase IN ('submitted','running','killed','done','failed','cancelled')", name="phase"),
    )

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    user: Mapped[str] = mapped_column(String(64))
    image: Mapped[str] = mapped_column(String(128))
    command_json: Mapped[str] = mapped_column(Text)
    vm_count: Mapped[int] = mapped_column(Integer, default=1)
    vcpus: Mapped[int] = mapped_column(Integer, default=1)
    memory_mb: Mapped[int] = mapped_column(Integer, default=128)
    walltime: Mapped[str] = mapped_column(String(16))
    home_site: Mapped[str] = mapped_column(String(64))
    site: Mapped[str] = mapped_column(String(64))
    oar_job_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    phase: Mapped[str] = mapped_column(String(16), default="submitted")
    hosts_json: Mapped[str] = mapped_column(Text, default="[]")
    kills: Mapped[int] = mapped_column(Integer, default=0)
    restarts_from_scratch: Mapped[int] = mapped_column(Integer, default=0)
    snapshot_label: Mapped[str | None] = mapped_column(String(64), nullable=True)
    snapshot_site: Mapped[str | None] = mapped_column(String(64), nullable=True)
    snapshot_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_event_id: Mapped[int] = mapped_column(BigInteger, default=0)
    error: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    # The compare-and-set lease (saline_bew.lease): the one site master that may act on this
    # vjob until lease_expires_at, so two masters never both resubmit one killed job.
    lease_owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lease_expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class SalineEventRecord(Base):
    """The journal of a Saline vjob: every submission, deployment, snapshot, kill and cleanup."""

    __tablename__ = "saline_events"
    __table_args__ = (Index("ix_saline_events_job_key", "job_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_key: Mapped[str] = mapped_column(ForeignKey("saline_jobs.key", ondelete="CASCADE"))
    at: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(32))
    site: Mapped[str] = mapped_column(String(64), default="")
    oar_job_id: Mapped[str] = mapped_column(String(32), default="")
    detail: Mapped[str] = mapped_column(Text, default="")


class LeaseRecord(Base):
    """A named lease (vjob.store.leases): who may act as, e.g., the Slurm agent of this cluster
    until `expires_at`. Taken and renewed by compare-and-set, so two holders never overlap."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    owner: Mapped[str] = mapped_column(String(128))
    expires_at: Mapped[float] = mapped_column(Float)
    acquired_at: Mapped[float] = mapped_column(Float)


class VOObservationRecord(Base):
    """A finished vjob the deadline agent watched (vjob.store.vo_observations): what the VO model
    predicted and what the job took, from which the agent refits the model online."""

    __tablename__ = "vo_observations"
    __table_args__ = (
        UniqueConstraint("job_id", "finished_at"),
        CheckConstraint("colocated >= 0", name="colocated"),
        CheckConstraint("walltime_s > 0 AND actual_s > 0 AND predicted_s > 0", name="durations"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(64))
    finished_at: Mapped[float] = mapped_column(Float)
    kind: Mapped[str | None] = mapped_column(String(16), nullable=True)
    """cpu / mem / io when known; NULL: the agent could not tell (counts for every kind)."""
    colocated: Mapped[int] = mapped_column(Integer)
    """The most other running jobs seen sharing a node with it."""
    walltime_s: Mapped[float] = mapped_column(Float)
    predicted_s: Mapped[float] = mapped_column(Float)
    actual_s: Mapped[float] = mapped_column(Float)
