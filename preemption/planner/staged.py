"""A placement built for two pools: as many arrivals as possible in the first, the rest in the second.

Why a placement of its own: on a crowded cluster (1,000 nodes / 5,000 VMs after an FCFS
decision: 97 % of the CPUs and 91 % of the memory taken in the end) most of a plan's cost was
waiting — every action after the first pool pays for it — because the other placements
choose nodes for the END state only: a run or a resume sent to a node that is full at the
start waits for a later pool, and a whole resume group waits with its last VM (measured, seed
1: 954 resumes in a fourth pool, 3.5 M of a 6.9 M plan). Here every arrival (run, resume,
the migration of a VM off a node its staying neighbours overload) is placed with two loads
per node in mind: the first pool's (everything running at the start still counts, plus the
arrivals placed early) and the end's (the staying VMs plus every arrival). An arrival is
*early* when a node has room for it in both, else *late* (room in the end only: what the
first pool's suspends and migrations free). A resume group is early only whole, so that its
vjob wakes in the first pool. The sequencer (sequencing.build_plan) then orders the result;
it is one more candidate, compared on its plan's cost like the others.

Choices, each measured on the benchmark's instances (docs/planner.md, "At BtrPlace's scale"):
the VMs that must leave an overloaded node first (the fewest, smallest computing ones), then
the resume groups, biggest first (whole, they are the hardest to fit), each VM home when the
state's node has room (a local resume costs half a remote one), then the runs, biggest first:
the end state is nearly full and packs best that way (smallest first left 32-71 VMs without
a node). A late action pays the first pool's cost whatever its size, so a late run is then made
early where moving an early idle run or resume to another node with room at the start makes
room for it (`_Stage.promote`), and an early remote resume is made local where moving a run or
a remote resume off its state's node makes room (`_Stage.localize`). An idle VM avoids nodes
with a CPU still free (memory taken beside a free CPU strands it; the start itself strands
31-45 nodes' CPUs this way on those instances), and a VM left without a node is fitted by
moving a run, a resume or an idle VM staying home out of its way (`_Stage.eject`, the
cheapest such move).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import numpy as np

from preemption.planner.instance import Instance, VMSpec
from preemption.planner.placement import Placement
from vjob.model import VJobState

R, S, W = VJobState.RUNNING, VJobState.SLEEPING, VJobState.WAITING


class _Stage:
    """Per node: capacities, the first pool's load and the end's; where each placed VM went, and whether early."""

    def __init__(self, inst: Instance) -> None:
        self.ids = [n.id for n in inst.nodes]
        self.col = {n: i for i, n in enumerate(self.ids)}
        size = len(self.ids)
        self.cap_cpu = np.array([n.cpu for n in inst.nodes], dtype=np.int64)
        self.cap_mem = np.array([n.mem for n in inst.nodes], dtype=np.int64)
        self.first_cpu = np.zeros(size, dtype=np.int64)
        self.first_mem = np.zeros(size, dtype=np.int64)
        self.end_cpu = np.zeros(size, dtype=np.int64)
        self.end_mem = np.zeros(size, dtype=np.int64)
        for vm in inst.vms:
            if vm.state is R and vm.host is not None:
                self.first_cpu[self.col[vm.host]] += vm.cpu
                self.first_mem[self.col[vm.host]] += vm.mem
        self.whole = inst.whole
        self.cpu_unit = 1.0 / max(1, int(self.cap_cpu.max(initial=1)))
        self.mem_unit = 1.0 / max(1, int(self.cap_mem.max(initial=1)))
        self.at: dict[str, tuple[int, bool]] = {}
        """Placed arrivals: vm → (node index, early)."""
        self.home: dict[str, int] = {}
        """Running VMs kept at home: vm → node index."""
        self.on: dict[int, list[VMSpec]] = {}
        """Per node, the runs, resumes and idle VMs kept home placed there: those `eject` and `promote` may move."""

    def share(self, vm: VMSpec) -> float:
        """The VM's share of the largest node, CPU plus memory: its size for sorting."""
        return vm.cpu * self.cpu_unit + vm.mem * self.mem_unit

    def fits(self, vm: VMSpec, early: bool) -> np.ndarray:
        """The nodes with room for `vm` in the end (and, when `early`, in the first pool too)."""
        ok = (self.end_cpu + vm.cpu <= self.cap_cpu) & (self.end_mem + vm.mem <= self.cap_mem)
        if early:
            ok &= (self.first_cpu + vm.cpu <= self.cap_cpu) & (self.first_mem + vm.mem <= self.cap_mem)
        return ok

    def choose(self, vm: VMSpec, early: bool, *, local: bool = True, avoid: int = -1) -> int | None:
        """The node for `vm`: its home when `local` and it has room, else the best fit; None if none fits.

        Best fit on the room left in the end, plus, when early, in the first pool; an idle VM
        avoids nodes with a CPU still free (it would fill the memory beside it).
        """
        ok = self.fits(vm, early)
        if avoid >= 0:
            ok[avoid] = False
        home = self.col.get(vm.host, -1) if vm.host is not None else -1
        if vm.pinned:
            return home if home >= 0 and ok[home] else None
        if local and home >= 0 and ok[home]:
            return home
        cand = np.flatnonzero(ok)
        if cand.size == 0:
            return None
        left_cpu = self.cap_cpu[cand] - self.end_cpu[cand] - vm.cpu
        slack = left_cpu * self.cpu_unit + (self.cap_mem[cand] - self.end_mem[cand] - vm.mem) * self.mem_unit
        if vm.cpu == 0:
            slack = slack + 4.0 * (left_cpu > 0)
        if early:
            first_cpu = self.cap_cpu[cand] - self.first_cpu[cand] - vm.cpu
            first_mem = self.cap_mem[cand] - self.first_mem[cand] - vm.mem
            slack = slack + first_cpu * self.cpu_unit + first_mem * self.mem_unit
            if vm.cpu == 0:
                slack = slack + 2.0 * (first_cpu > 0)
        return int(cand[int(np.argmin(slack))])

    def put(self, vm: VMSpec, node: int, early: bool) -> None:
        """`vm` arrives on `node`: in the end load, and in the first pool's when `early`."""
        self.end_cpu[node] += vm.cpu
        self.end_mem[node] += vm.mem
        if early:
            self.first_cpu[node] += vm.cpu
            self.first_mem[node] += vm.mem
        self.at[vm.id] = (node, early)
        if vm.state is not R:
            self.on.setdefault(node, []).append(vm)

    def take(self, vm: VMSpec, staying: bool = False) -> None:
        """Undo `put` (or `stay`, when `staying`)."""
        if staying:
            node, early = self.home.pop(vm.id), False
        else:
            node, early = self.at.pop(vm.id)
        self.end_cpu[node] -= vm.cpu
        self.end_mem[node] -= vm.mem
        if early:
            self.first_cpu[node] -= vm.cpu
            self.first_mem[node] -= vm.mem
        if vm in self.on.get(node, ()):
            self.on[node].remove(vm)

    def eject(self, vm: VMSpec, tries: int = 512) -> bool:
        """Fit `vm` by moving one VM out of its way: on a node with the CPUs for it, a run or resume
        (it keeps its pool) or an idle VM staying home (it migrates) whose move to another node
        with room leaves room; the cheapest such move (see `cost` below) among the
        `tries` nodes nearest to having room. False when there is none."""
        cand = np.flatnonzero(self.end_cpu + vm.cpu <= self.cap_cpu)
        home = self.col.get(vm.host, -1) if vm.host is not None else -1
        if vm.pinned:
            cand = cand[cand == home]
        short = self.end_mem[cand] + vm.mem - self.cap_mem[cand]
        cand = cand[np.argsort(short, kind="stable")[:tries]]
        moves: list[tuple[int, int, str, int, VMSpec]] = []
        for node in cand.tolist():
            for other in self.on.get(node, ()):
                if (
                    self.end_mem[node] - other.mem + vm.mem <= self.cap_mem[node]
                    and self.end_cpu[node] - other.cpu + vm.cpu <= self.cap_cpu[node]
                ):
                    # A VM staying home migrates, a local resume becomes remote: its memory more.
                    cost = other.mem if other.host == self.ids[node] else 0
                    moves.append((cost, other.mem, other.id, node, other))
        room = _RoomCache(self)
        for _, _, _, node, other in sorted(moves, key=lambda m: m[:3]):
            staying = other.state is R
            early = staying or self.at[other.id][1]
            if not room.elsewhere(other, early, node):
                if not (staying and room.elsewhere(other, False, node)):
                    continue
                early = False
            self.take(other, staying)
            self.end_cpu[node] += vm.cpu  # hold the room for `vm` while `other` looks for a node
            self.end_mem[node] += vm.mem
            dest = self.choose(other, early, local=not staying, avoid=node)
            self.end_cpu[node] -= vm.cpu
            self.end_mem[node] -= vm.mem
            assert dest is not None  # room.elsewhere said so, and only `node` changed
            self.put(other, dest, self.first_fits(other, dest) if staying else early)
            self.place_on(vm, node)
            return True
        return False

    def promote(self, vm: VMSpec, tries: int = 32) -> bool:
        """Make the late run `vm` early: on one of the `tries` nodes nearest to having the memory for
        it at the start, `make_room` for it. False (and `vm` left as it was) when none can."""
        node0, _ = self.at[vm.id]
        self.take(vm)
        cand = np.flatnonzero((self.first_cpu + vm.cpu <= self.cap_cpu) & (self.end_cpu + vm.cpu <= self.cap_cpu))
        short = self.first_mem[cand] + vm.mem - self.cap_mem[cand]
        room = _RoomCache(self)
        for node in cand[np.argsort(short, kind="stable")[:tries]].tolist():
            if self.make_room(vm, node, room, keep_local=False):
                return True
        self.put(vm, node0, False)
        return False

    def localize(self, vm: VMSpec) -> bool:
        """Make the early remote resume `vm` local (half its cost): `make_room` for it at the node
        holding its state, moving only VMs that cost nothing more elsewhere. False if it cannot."""
        home = self.col.get(vm.host, -1) if vm.host is not None else -1
        node0, early = self.at[vm.id]
        if home < 0 or not early or node0 == home or vm.pinned:
            return False
        self.take(vm)
        if self.make_room(vm, home, _RoomCache(self), keep_local=True):
            return True
        self.put(vm, node0, True)
        return False

    def make_room(self, vm: VMSpec, node: int, room: _RoomCache, *, keep_local: bool) -> bool:
        """Put `vm` early on `node`, moving one early idle-first arrival (a run or a resume; it stays
        early) to another node with room at the start when `node` lacks it. A resume moved from
        the node holding its state becomes remote (its memory more): `keep_local` forbids that."""
        if self.first_fits(vm, node) and self.end_fits(vm, node):
            self.put(vm, node, True)
            return True
        here = self.ids[node]
        movable = [o for o in self.on.get(node, ()) if o.state is not R and not o.pinned and self.at[o.id][1]]
        if keep_local:
            movable = [o for o in movable if o.host != here]
        # Idle first, then those a move keeps remote (a local resume made remote costs more).
        for other in sorted(movable, key=lambda o: (o.cpu, o.host == here, -o.mem, o.id)):
            if not (
                self.first_mem[node] - other.mem + vm.mem <= self.cap_mem[node]
                and self.end_mem[node] - other.mem + vm.mem <= self.cap_mem[node]
                and self.first_cpu[node] - other.cpu + vm.cpu <= self.cap_cpu[node]
                and self.end_cpu[node] - other.cpu + vm.cpu <= self.cap_cpu[node]
                and room.elsewhere(other, True, node)
            ):
                continue
            self.take(other)
            self.put(vm, node, True)
            dest = self.choose(other, True, avoid=node)
            assert dest is not None  # room.elsewhere said so, and only `node` changed
            self.put(other, dest, True)
            return True
        return False

    def end_fits(self, vm: VMSpec, node: int) -> bool:
        return bool(
            self.end_cpu[node] + vm.cpu <= self.cap_cpu[node] and self.end_mem[node] + vm.mem <= self.cap_mem[node]
        )

    def first_fits(self, vm: VMSpec, node: int) -> bool:
        return bool(
            self.first_cpu[node] + vm.cpu <= self.cap_cpu[node] and self.first_mem[node] + vm.mem <= self.cap_mem[node]
        )

    def stay(self, vm: VMSpec, node: int) -> None:
        """A running VM kept at home: in the end load (the first pool's counts it from the start)."""
        self.end_cpu[node] += vm.cpu
        self.end_mem[node] += vm.mem
        self.home[vm.id] = node
        if not vm.pinned and vm.cpu == 0 and vm.vjob not in self.whole:  # a whole vjob moves only by a cut
            self.on.setdefault(node, []).append(vm)

    def place_on(self, vm: VMSpec, node: int) -> None:
        """`vm` on `node` (known to have room in the end), early when the first pool has room too."""
        self.put(vm, node, self.first_fits(vm, node))


class _RoomCache:
    """Which nodes have room for a VM of a given size (and pool), computed once per size while the
    loads do not change (`eject` and `promote` commit at most one move per call)."""

    def __init__(self, st: _Stage) -> None:
        self.st = st
        self.known: dict[tuple[int, int, bool], np.ndarray] = {}

    def elsewhere(self, vm: VMSpec, early: bool, node: int) -> bool:
        """Some node but `node` (and but the VM's own, for a running VM) has room for `vm`."""
        key = (vm.cpu, vm.mem, early)
        if key not in self.known:
            self.known[key] = self.st.fits(vm, early)
        ok = self.known[key]
        own = self.st.col.get(vm.host, -1) if vm.state is R and vm.host is not None else -1
        if vm.pinned:
            return False
        return int(ok.sum()) - int(ok[node]) - int(own >= 0 and own != node and ok[own]) > 0


def staged_placement(inst: Instance, *, deadline: float | None = None) -> tuple[Placement, list[VMSpec]]:
    """A viable placement with as many arrivals as possible in the first pool; (placement, VMs left out).

    See the module docstring for the order of the choices. The repairs (`_Stage.eject` for the
    few VMs the end packing strands, then `promote` and `localize`) stop at `deadline` (a
    time.perf_counter() value): VMs still without a node are returned, and the caller drops the
    placement; the other two only leave the placement less good.
    """
    st = _Stage(inst)
    movers, left = _stay_home(inst, st)
    groups: dict[str, list[VMSpec]] = {}
    runs: list[VMSpec] = []
    for vm in inst.to_run():
        if vm.state is S:
            groups.setdefault(vm.vjob, []).append(vm)
        elif vm.state is W:
            runs.append(vm)
    late: list[list[VMSpec]] = []
    for vm in sorted(movers, key=lambda v: (-st.share(v), v.id)):
        node = st.choose(vm, True, avoid=st.col[vm.host or ""])
        if node is None:
            late.append([vm])
        else:
            st.put(vm, node, True)
    for group in sorted(groups.values(), key=lambda g: (-sum(st.share(v) for v in g), g[0].vjob)):
        if not _early_group(st, group):
            late.append(group)
    for vm in _biggest_first(st, runs):
        node = st.choose(vm, True)
        if node is None:
            late.append([vm])
        else:
            st.put(vm, node, True)
    for unit in late:
        for vm in _biggest_first(st, unit):
            avoid = st.col[vm.host] if vm.state is R and vm.host is not None else -1
            node = st.choose(vm, False, avoid=avoid)
            if node is not None:
                st.put(vm, node, False)
            elif (deadline is not None and time.perf_counter() > deadline) or not st.eject(vm):
                left.append(vm)
    for vm in _biggest_first(st, (v for v in runs if v.id in st.at and not st.at[v.id][1])):
        if deadline is not None and time.perf_counter() > deadline:
            break
        st.promote(vm)
    for group in groups.values():
        for vm in _biggest_first(st, group):
            if deadline is not None and time.perf_counter() > deadline:
                break
            if vm.id in st.at:
                st.localize(vm)
    out = {vm_id: st.ids[node] for vm_id, node in st.home.items()}
    out.update({vm_id: st.ids[node] for vm_id, (node, _) in st.at.items()})
    return out, left


def _biggest_first(st: _Stage, vms: Iterable[VMSpec]) -> list[VMSpec]:
    return sorted(vms, key=lambda v: (-st.share(v), v.id))


def _early_group(st: _Stage, group: list[VMSpec]) -> bool:
    """Place the whole resume group early (True), or nothing of it (False)."""
    placed: list[VMSpec] = []
    for vm in _biggest_first(st, group):
        node = st.choose(vm, True)
        if node is None:
            for done in placed:
                st.take(done)
            return False
        st.put(vm, node, True)
        placed.append(vm)
    return True


def _stay_home(inst: Instance, st: _Stage) -> tuple[list[VMSpec], list[VMSpec]]:
    """Keep every running VM that stays running at home, but for the fewest (smallest) VMs that must
    leave a node its staying neighbours overload; (those, which migrate; the pinned VMs of a node
    that their pinned neighbours alone overload, which fit nowhere)."""
    staying: dict[int, list[VMSpec]] = {}
    for vm in inst.to_run():
        if vm.state is R and vm.host is not None:
            staying.setdefault(st.col[vm.host], []).append(vm)
    movers: list[VMSpec] = []
    stuck: list[VMSpec] = []
    for node, vms in staying.items():
        cpu = sum(v.cpu for v in vms)
        mem = sum(v.mem for v in vms)
        # Pinned VMs never leave; a whole vjob's VM leaves only last (it costs a cut of the vjob).
        for vm in sorted(vms, key=lambda v: (v.pinned, v.vjob in inst.whole, v.mem, -v.cpu, v.id)):
            over_cpu = cpu > st.cap_cpu[node]
            over_mem = mem > st.cap_mem[node]
            if not vm.pinned and ((over_cpu and vm.cpu > 0) or over_mem):
                cpu -= vm.cpu
                mem -= vm.mem
                movers.append(vm)
            else:
                st.stay(vm, node)
        if cpu > st.cap_cpu[node] or mem > st.cap_mem[node]:
            stuck.extend(v for v in vms if v.pinned)
    return movers, stuck
