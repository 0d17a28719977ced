"""The domain model: jobs, nodes, VMs, and the ClusterView that policies receive.

Why plain frozen dataclasses: a ClusterView is one consistent snapshot of the cluster at one
instant, handed to pure policy functions by both the live agent and the simulator. Immutability
means a policy cannot change what another policy sees, and the simulator can keep old views.

Times are POSIX seconds (float) everywhere in the model, so the simulator (which starts at 0)
and the live agent (which uses the wall clock) share the same arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import Field

from vjob.errors import InputError, TransitionError
from vjob.json_input import MAX_ITEMS, MAX_NAME, Count, InputModel, Name, Seconds, validate


class JobClass(StrEnum):
    """How the RMS classes a job; decides whether it may preempt or be preempted."""

    BATCH = "batch"
    INTERACTIVE = "interactive"
    BESTEFFORT = "besteffort"


class JobState(StrEnum):
    """The job's state as its RMS reports it, reduced to what vjob policies need."""

    PENDING = "pending"
    RUNNING = "running"
    SUSPENDED = "suspended"
    HELD = "held"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)


class NodeState(StrEnum):
    """A node's availability as the RMS reports it."""

    IDLE = "idle"
    ALLOCATED = "allocated"
    MIXED = "mixed"
    DOWN = "down"
    DRAINED = "drained"

    @property
    def usable(self) -> bool:
        return self in (NodeState.IDLE, NodeState.ALLOCATED, NodeState.MIXED)


class VJobState(StrEnum):
    """The vjob life cycle of the Entropy paper (section 2.2)."""

    WAITING = "waiting"
    RUNNING = "running"
    SLEEPING = "sleeping"
    TERMINATED = "terminated"


class VMState(StrEnum):
    """A single VM's state; a vjob's state is the common state of its VMs."""

    DEFINED = "defined"
    RUNNING = "running"
    SAVED = "saved"
    STOPPED = "stopped"


class Action(StrEnum):
    """The actions that move a vjob (or one of its VMs) through the life cycle."""

    RUN = "run"
    STOP = "stop"
    SUSPEND = "suspend"
    RESUME = "resume"
    MIGRATE = "migrate"


# Entropy Figure 2: run takes a waiting vjob to running, suspend/resume toggle running and
# sleeping, stop ends a running vjob, and migrate moves a VM without changing the state.
TRANSITIONS: Mapping[tuple[VJobState, Action], VJobState] = MappingProxyType(
    {
        (VJobState.WAITING, Action.RUN): VJobState.RUNNING,
        (VJobState.RUNNING, Action.SUSPEND): VJobState.SLEEPING,
        (VJobState.SLEEPING, Action.RESUME): VJobState.RUNNING,
        (VJobState.RUNNING, Action.STOP): VJobState.TERMINATED,
        (VJobState.RUNNING, Action.MIGRATE): VJobState.RUNNING,
    }
)


def transition(state: VJobState, action: Action) -> VJobState:
    """The state a vjob reaches by `action`, or TransitionError when the paper forbids it."""
    try:
        return TRANSITIONS[(state, action)]
    except KeyError:
        allowed = sorted(a.value for (s, a) in TRANSITIONS if s == state)
        raise TransitionError(
            f"cannot {action.value} a vjob in state {state.value}; "
            f"allowed from {state.value}: {', '.join(allowed) or 'nothing'}"
        ) from None


@dataclass(frozen=True, slots=True)
class Job:
    """A job as vjob tracks it: what the RMS says plus vjob's own history of it."""

    id: str
    user: str
    job_class: JobClass = JobClass.BATCH
    rms: str = "sim"
    account: str = ""
    nodes: int = 1
    cores: int = 1
    memory_mb: int = 1024
    os_image: str = ""
    submit_time: float = 0.0
    start_time: float | None = None
    end_time: float | None = None
    walltime: float | None = None
    state: JobState = JobState.PENDING
    vjob_state: VJobState = VJobState.WAITING
    allocated_nodes: tuple[str, ...] = ()
    preempt_count: int = 0
    preempted_seconds: float = 0.0
    preempted_since: float | None = None
    deadline: float | None = None
    """POSIX seconds by which the job must end (Slurm --deadline, #VJOB deadline=); None: none."""

    def __post_init__(self) -> None:
        if not self.id:
            raise InputError("job.id: must not be empty")
        if self.nodes < 1:
            raise InputError(f"job {self.id}: nodes = {self.nodes}: must be >= 1")
        if self.cores < 1:
            raise InputError(f"job {self.id}: cores = {self.cores}: must be >= 1")
        if self.memory_mb < 0:
            raise InputError(f"job {self.id}: memory_mb = {self.memory_mb}: must be >= 0")
        if self.preempt_count < 0 or self.preempted_seconds < 0:
            raise InputError(f"job {self.id}: preemption counters must be >= 0")

    @property
    def interactive(self) -> bool:
        return self.job_class is JobClass.INTERACTIVE

    def queue_time(self, now: float) -> float:
        """Seconds spent waiting so far (0 once it has started)."""
        if self.state is JobState.PENDING or self.state is JobState.HELD:
            return max(0.0, now - self.submit_time)
        return 0.0

    def apply(self, action: Action) -> Job:
        """The same job after `action`, refused when the life cycle forbids it."""
        return replace(self, vjob_state=transition(self.vjob_state, action))


@dataclass(frozen=True, slots=True)
class Node:
    """A compute node; `os_image` is UBIS's VM_os, the image its VMs currently run."""

    name: str
    cpus: int
    memory_mb: int
    site: str = "default"
    os_image: str = ""
    state: NodeState = NodeState.IDLE
    features: tuple[str, ...] = ()
    weight: int = 1
    """The RMS's scheduling weight (Slurm `Weight`, lower is allocated first); with the features
    it tells a heterogeneous farm's sub-clusters apart (preemption.remap.models.subcluster_of)."""

    def __post_init__(self) -> None:
        if not self.name:
            raise InputError("node.name: must not be empty")
        if self.weight < 0:
            raise InputError(f"node {self.name}: weight = {self.weight}: must be >= 0")
        if self.cpus < 1:
            raise InputError(f"node {self.name}: cpus = {self.cpus}: must be >= 1")
        if self.memory_mb < 1:
            raise InputError(f"node {self.name}: memory_mb = {self.memory_mb}: must be >= 1")


@dataclass(frozen=True, slots=True)
class VM:
    """One virtual machine of a vjob; `node` is None while it is not placed anywhere."""

    name: str
    job_id: str
    image: str
    vcpus: int = 1
    memory_mb: int = 512
    node: str | None = None
    state: VMState = VMState.DEFINED

    def __post_init__(self) -> None:
        if not self.name:
            raise InputError("vm.name: must not be empty")
        if self.vcpus < 1:
            raise InputError(f"vm {self.name}: vcpus = {self.vcpus}: must be >= 1")
        if self.memory_mb < 1:
            raise InputError(f"vm {self.name}: memory_mb = {self.memory_mb}: must be >= 1")


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Everything a policy may look at, observed at one instant `now`.

    `usage` is each user's decayed usage in node-seconds and `targets` each user's target
    share (0..1); both come from the state store (or the simulator's own bookkeeping).
    """

    now: float
    jobs: tuple[Job, ...] = ()
    nodes: tuple[Node, ...] = ()
    vms: tuple[VM, ...] = ()
    images: tuple[str, ...] = ()
    usage: Mapping[str, float] = field(default_factory=dict)
    targets: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not math.isfinite(self.now):
            raise InputError(f"clusterview.now = {self.now}: must be a finite number")
        _unique("job", (j.id for j in self.jobs))
        _unique("node", (n.name for n in self.nodes))
        _unique("vm", (v.name for v in self.vms))
        # Freeze the mappings so that no policy can change what the next one sees.
        object.__setattr__(self, "usage", MappingProxyType(dict(self.usage)))
        object.__setattr__(self, "targets", MappingProxyType(dict(self.targets)))

    @property
    def pending(self) -> tuple[Job, ...]:
        return tuple(j for j in self.jobs if j.state in (JobState.PENDING, JobState.HELD))

    @property
    def running(self) -> tuple[Job, ...]:
        return tuple(j for j in self.jobs if j.state is JobState.RUNNING)

    def job(self, job_id: str) -> Job:
        for j in self.jobs:
            if j.id == job_id:
                return j
        raise KeyError(job_id)

    def busy_nodes(self) -> frozenset[str]:
        return frozenset(n for j in self.running for n in j.allocated_nodes)

    def free_nodes(self) -> tuple[Node, ...]:
        busy = self.busy_nodes()
        return tuple(n for n in self.nodes if n.state.usable and n.name not in busy)

    # -- JSON ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; the format is documented in docs/clusterview.md."""
        return {
            "now": self.now,
            "nodes": [to_plain(n) for n in self.nodes],
            "jobs": [to_plain(j) for j in self.jobs],
            "vms": [to_plain(v) for v in self.vms],
            "images": list(self.images),
            "usage": dict(self.usage),
            "targets": dict(self.targets),
        }

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "clusterview") -> ClusterView:
        """Build a view from `to_dict` output (a hostile file, maybe): validated by
        `ClusterViewInput` (types, bounds, unknown keys), errors naming the field path."""
        parsed = validate(ClusterViewInput, data, source)
        return cls(
            now=parsed.now,
            nodes=tuple(Node(**_fields(n)) for n in parsed.nodes),
            jobs=tuple(Job(**_fields(j)) for j in parsed.jobs),
            vms=tuple(VM(**_fields(v)) for v in parsed.vms),
            images=tuple(parsed.images),
            usage=dict(parsed.usage),
            targets=dict(parsed.targets),
        )


def _unique(kind: str, names: Iterable[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InputError(f"duplicate {kind} id {name!r} in the cluster view")
        seen.add(name)


def to_plain(obj: Any) -> dict[str, Any]:
    """A JSON-ready dict of a model dataclass (enums as their values, tuples as lists)."""
    out: dict[str, Any] = {}
    for name in obj.__dataclass_fields__:
        value = getattr(obj, name)
        if isinstance(value, tuple):
            value = list(value)
        out[name] = value.value if isinstance(value, StrEnum) else value
    return out


# -- JSON input models (pydantic): what a ClusterView file may hold --------------------------
def _values(enum: type[StrEnum]) -> Any:
    return Literal[tuple(e.value for e in enum)]


class NodeInput(InputModel):
    """A compute node of a saved cluster view."""

    name: Name
    cpus: int = Field(ge=1, le=1_000_000)
    """CPU cores the RMS lets jobs use."""
    memory_mb: int = Field(ge=1)
    """Memory in MB."""
    site: Name = "default"
    os_image: str = Field("", max_length=MAX_NAME)
    """The OS image its VMs run now (UBIS's VM_os); empty: none."""
    state: _values(NodeState) = NodeState.IDLE.value  # type: ignore[valid-type]
    features: list[Name] = Field([], max_length=1000)
    weight: int = Field(1, ge=0)
    """The RMS's scheduling weight (lower is allocated first)."""


class JobInput(InputModel):
    """A job of a saved cluster view."""

    id: Name
    user: Name
    job_class: _values(JobClass) = JobClass.BATCH.value  # type: ignore[valid-type]
    rms: Name = "sim"
    account: str = Field("", max_length=MAX_NAME)
    nodes: int = Field(1, ge=1, le=1_000_000)
    """Nodes the job needs."""
    cores: int = Field(1, ge=1)
    """Cores per node."""
    memory_mb: int = Field(1024, ge=0)
    """Memory per node in MB."""
    os_image: str = Field("", max_length=MAX_NAME)
    """The OS image the job asks for; empty: any."""
    submit_time: Seconds = 0.0
    """POSIX seconds."""
    start_time: Seconds | None = None
    end_time: Seconds | None = None
    walltime: Seconds | None = Field(None, ge=0)
    """Requested run time in seconds."""
    state: _values(JobState) = JobState.PENDING.value  # type: ignore[valid-type]
    vjob_state: _values(VJobState) = VJobState.WAITING.value  # type: ignore[valid-type]
    allocated_nodes: list[Name] = Field([], max_length=MAX_ITEMS)
    preempt_count: Count = 0
    """Times the job was preempted (UBIS Pn)."""
    preempted_seconds: Seconds = Field(0.0, ge=0)
    """Seconds spent preempted (UBIS Pt)."""
    preempted_since: Seconds | None = None
    deadline: Seconds | None = None
    """POSIX seconds by which the job must end; absent: no deadline."""


class VMInput(InputModel):
    """A VM of a saved cluster view."""

    name: Name
    job_id: Name
    image: Name
    vcpus: int = Field(1, ge=1)
    memory_mb: int = Field(512, ge=1)
    node: Name | None = None
    state: _values(VMState) = VMState.DEFINED.value  # type: ignore[valid-type]


class ClusterViewInput(InputModel):
    """A ClusterView saved as JSON (docs/clusterview.md): `vjob prio --from FILE` reads it."""

    now: Seconds
    """POSIX seconds of the observation."""
    nodes: list[NodeInput] = Field([], max_length=MAX_ITEMS)
    jobs: list[JobInput] = Field([], max_length=MAX_ITEMS)
    vms: list[VMInput] = Field([], max_length=MAX_ITEMS)
    images: list[Name] = Field([], max_length=100_000)
    usage: dict[Name, Seconds] = Field({}, max_length=MAX_ITEMS)
    """Decayed usage per user (node-seconds)."""
    targets: dict[Name, Annotated[float, Field(ge=0, le=1)]] = Field({}, max_length=MAX_ITEMS)
    """Target share per user, 0..1."""


_ENUMS: dict[str, type[StrEnum]] = {"job_class": JobClass, "vjob_state": VJobState}


def _fields(item: InputModel) -> dict[str, Any]:
    """An input model's fields as dataclass arguments (enums as enums, lists as tuples)."""
    out: dict[str, Any] = {}
    enums = {**_ENUMS, "state": {NodeInput: NodeState, JobInput: JobState, VMInput: VMState}[type(item)]}
    for key, value in item:
        if key in enums:
            value = enums[key](value)
        elif isinstance(value, list):
            value = tuple(value)
        out[key] = value
    return out
