"""The planner's input: a configuration (nodes, VMs and their states) and a target state per vjob.

Why a separate, self-contained input type rather than a ClusterView: the planner must be
callable from the live agent, the simulator, the benchmark and the `vjob plan` command with the
same few facts (capacities, demands, states, hosts), and every one of those facts is checked
here once, with an error naming the entry, so the planning code can trust its input.

Memory is in MB and CPU in processing units (integers), as in the Entropy paper: a VM needs a
whole CPU while it computes and none while it idles.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any, Literal

from pydantic import Field

from vjob.errors import InputError
from vjob.json_input import MAX_ITEMS, InputModel, Name, validate
from vjob.model import TRANSITIONS, ClusterView, VJobState, VMState

INITIAL_STATES = (VJobState.WAITING, VJobState.RUNNING, VJobState.SLEEPING)


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A working node: how many CPUs and MB of memory its VMs may use."""

    id: str
    cpu: int
    mem: int


@dataclass(frozen=True, slots=True)
class VMSpec:
    """One VM of a vjob; `host` is the running host, or where a sleeping VM's state lies."""

    id: str
    vjob: str
    cpu: int
    mem: int
    state: VJobState
    host: str | None = None
    pinned: bool = False
    """It may change state but not node: it keeps running on `host`, or resumes there (a VM of
    a multi-node vjob, whose pilot moves its VMs together or not at all)."""


@dataclass(frozen=True)
class Instance:
    """A configuration plus the target state of every vjob (missing targets keep their state)."""

    nodes: tuple[NodeSpec, ...]
    vms: tuple[VMSpec, ...]
    target: Mapping[str, VJobState] = field(default_factory=dict)
    whole: frozenset[str] = frozenset()
    """vjobs whose VMs move only together, by one cut: never migrated VM by VM; a plan that
    moves any of their VMs suspends them all in one pool and resumes them all, each on its
    new node, in a later one (one coordinated checkpoint). Why: one pilot holds the VMs of a
    multi-node job and checkpoints them as one consistent cut (provisioning.coordinated);
    moving some of them live while the others run would split the job (docs/planner.md,
    "vjobs that move whole")."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "whole", frozenset(self.whole))
        _check(self)
        full = {vm.vjob: vm.state for vm in self.vms}
        full.update(self.target)
        object.__setattr__(self, "target", MappingProxyType(full))

    # -- look-ups -------------------------------------------------------------------------
    @cached_property
    def node_by_id(self) -> Mapping[str, NodeSpec]:
        return MappingProxyType({n.id: n for n in self.nodes})

    @cached_property
    def vm_by_id(self) -> Mapping[str, VMSpec]:
        return MappingProxyType({v.id: v for v in self.vms})

    def vjobs(self) -> dict[str, list[VMSpec]]:
        """The VMs of each vjob, in input order."""
        out: dict[str, list[VMSpec]] = {}
        for vm in self.vms:
            out.setdefault(vm.vjob, []).append(vm)
        return out

    def target_of(self, vm: VMSpec) -> VJobState:
        return self.target[vm.vjob]

    def to_run(self) -> list[VMSpec]:
        """The VMs that must be running, hence placed, in the target configuration."""
        return [vm for vm in self.vms if self.target[vm.vjob] is VJobState.RUNNING]

    def with_target(self, target: Mapping[str, VJobState]) -> Instance:
        return Instance(self.nodes, self.vms, dict(target), self.whole)

    # -- JSON -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": [{"id": n.id, "cpu": n.cpu, "mem": n.mem} for n in self.nodes],
            "vms": [
                {"id": v.id, "vjob": v.vjob, "cpu": v.cpu, "mem": v.mem, "state": v.state.value, "host": v.host}
                | ({"pinned": True} if v.pinned else {})
                for v in self.vms
            ],
            "target": {k: s.value for k, s in self.target.items()},
        } | ({"whole": sorted(self.whole)} if self.whole else {})

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "instance") -> Instance:
        """Parse the instance JSON (docs/planner.md, `vjob schema instance`): types and bounds
        by `InstanceInput`, errors naming the field path; then the cross-entry checks."""
        parsed = validate(InstanceInput, data, source)
        nodes = tuple(NodeSpec(n.id, n.cpu, n.mem) for n in parsed.nodes)
        vms = tuple(VMSpec(v.id, v.vjob, v.cpu, v.mem, VJobState(v.state), v.host, v.pinned) for v in parsed.vms)
        return cls(nodes, vms, {k: VJobState(v) for k, v in parsed.target.items()}, frozenset(parsed.whole))


class NodeInput(InputModel):
    """A working node of a planner instance."""

    id: Name
    cpu: int = Field(ge=0, le=1_000_000)
    """Processing units its VMs may use."""
    mem: int = Field(ge=1)
    """Memory its VMs may use, in MB."""


class VMInput(InputModel):
    """A VM of a planner instance."""

    id: Name
    vjob: Name
    """The vjob it belongs to: a vjob's VMs change state together."""
    cpu: int = Field(ge=0, le=1_000_000)
    """Processing units it needs while it computes."""
    mem: int = Field(ge=1)
    """Memory in MB."""
    state: Literal["waiting", "running", "sleeping"]
    host: Name | None = None
    """Its node when running; where its saved state lies when sleeping; null when waiting."""
    pinned: bool = False
    """It may not change node (run on or resume at `host` only): a VM of a multi-node vjob."""


class InstanceInput(InputModel):
    """The planner's input (`vjob plan INSTANCE.json`): nodes, VMs, and each vjob's target state."""

    nodes: list[NodeInput] = Field(max_length=MAX_ITEMS)
    vms: list[VMInput] = Field(max_length=MAX_ITEMS)
    target: dict[Name, Literal[tuple(s.value for s in VJobState)]] = Field({}, max_length=MAX_ITEMS)  # type: ignore[valid-type]
    """vjob → the state it must reach; a vjob not listed keeps its state."""
    whole: list[Name] = Field([], max_length=MAX_ITEMS)
    """vjobs whose VMs move only together, by one cut (suspended in one pool, resumed on their
    new nodes in a later one), never migrated VM by VM: a multi-node vjob's."""


def _check(inst: Instance) -> None:
    """Cross-entry checks: unique ids, known hosts, consistent vjobs, reachable targets."""
    nodes: dict[str, NodeSpec] = {}
    for n in inst.nodes:
        if n.id in nodes:
            raise InputError(f"duplicate node id {n.id!r}")
        nodes[n.id] = n
    seen: set[str] = set()
    states: dict[str, VJobState] = {}
    for vm in inst.vms:
        if vm.id in seen:
            raise InputError(f"duplicate vm id {vm.id!r}")
        seen.add(vm.id)
        if vm.state not in INITIAL_STATES:
            raise InputError(f"vm {vm.id}: state = {vm.state.value!r}: must be waiting, running or sleeping")
        if vm.host is not None and vm.host not in nodes:
            raise InputError(f"vm {vm.id}: host = {vm.host!r}: unknown node")
        if vm.state is VJobState.RUNNING and vm.host is None:
            raise InputError(f"vm {vm.id}: a running VM needs a host")
        if vm.state is VJobState.WAITING and vm.host is not None:
            raise InputError(f"vm {vm.id}: host = {vm.host!r}: a waiting VM has no host (use null)")
        if vm.pinned and vm.host is None:
            raise InputError(f"vm {vm.id}: pinned = true: a waiting VM has no node to be pinned to")
        if not any(n.cpu >= vm.cpu and n.mem >= vm.mem for n in inst.nodes):
            raise InputError(f"vm {vm.id}: needs cpu {vm.cpu} and mem {vm.mem} MB: larger than any node")
        first = states.setdefault(vm.vjob, vm.state)
        if first is not vm.state:
            raise InputError(
                f"vjob {vm.vjob}: its VMs are in different states ({first.value} and {vm.state.value} for {vm.id})"
            )
    for vjob in sorted(inst.whole):
        if vjob not in states:
            raise InputError(f"whole: {vjob!r}: unknown vjob (no VM belongs to it)")
    for vjob, goal in inst.target.items():
        if vjob not in states:
            raise InputError(f"target.{vjob}: unknown vjob (no VM belongs to it)")
        if not isinstance(goal, VJobState):
            raise InputError(f"target.{vjob} = {goal!r}: must be a vjob state")
        now = states[vjob]
        if goal is now:
            continue
        if not any(s is now and to is goal for (s, _action), to in TRANSITIONS.items()):
            raise InputError(f"target.{vjob} = {goal.value!r}: a {now.value} vjob cannot become {goal.value}")


_VM_STATES = {
    VMState.RUNNING: VJobState.RUNNING,
    VMState.SAVED: VJobState.SLEEPING,
    VMState.DEFINED: VJobState.WAITING,
    VMState.STOPPED: VJobState.WAITING,
}


def instance_from_view(view: ClusterView, target: Mapping[str, VJobState]) -> Instance:
    """The planner's input from the agent's or the simulator's ClusterView.

    Usable nodes only (a down or drained node receives nothing); a VM's vjob is its job id,
    its demand its vCPUs and memory; running → running on its node, saved → sleeping with its
    state on its node, defined or stopped → waiting. A VM on a node that is not usable is an
    error: its vjob cannot be planned until the operator or the RMS deals with the node.
    """
    nodes = tuple(NodeSpec(n.name, n.cpus, n.memory_mb) for n in view.nodes if n.state.usable)
    usable = {n.id for n in nodes}
    vms = []
    for vm in view.vms:
        state = _VM_STATES[vm.state]
        host = vm.node if state is not VJobState.WAITING else None
        if host is not None and host not in usable:
            raise InputError(f"vm {vm.name} of job {vm.job_id}: node {host!r} is not usable (down, drained or unknown)")
        vms.append(VMSpec(vm.name, vm.job_id, vm.vcpus, vm.memory_mb, state, host))
    return Instance(nodes, tuple(vms), dict(target))
