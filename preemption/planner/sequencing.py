"""From a target placement to pools of actions that keep every step viable (Entropy section 4.1).

Why pools are built greedily, one at a time: suspend and stop only free resources, so they are
always feasible and all go into the first pool; an action that needs room (run, resume, the
arrival of a migration) joins the earliest pool in which its destination has room on top of
everything still there during that pool, a migrating VM counting on both its nodes until the
pool ends. A node is only ever blocked by VMs that are still to leave it, so when no action
fits the pending migrations form a cycle (paper Figure 8), broken by moving one of its VMs to
a pivot node outside the cycle. The resumes of one vjob are admitted together or not at all,
so a vjob wakes up in a single pool. A vjob that moves only whole (`Instance.whole`) and whose
placement moves any of its VMs is moved by one cut instead of migrations: all its VMs
suspended in the first pool, then resumed together, each on its planned node (the ones that
stay, in place), in a later pool.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from preemption.planner.instance import Instance, VMSpec
from preemption.planner.plan import Plan, PlanAction, local_cost, plan_cost
from vjob.errors import VjobError
from vjob.model import Action, VJobState


class SequencingError(VjobError):
    """No viable order exists for this placement (e.g. a migration cycle with no pivot node)."""


@dataclass
class _Load:
    """CPU and memory used on each node, and the node capacities."""

    cpu: dict[str, int]
    mem: dict[str, int]
    cap_cpu: dict[str, int]
    cap_mem: dict[str, int]

    def room(self, node: str, cpu: int, mem: int, extra_cpu: int = 0, extra_mem: int = 0) -> bool:
        return (
            self.cpu[node] + extra_cpu + cpu <= self.cap_cpu[node]
            and self.mem[node] + extra_mem + mem <= self.cap_mem[node]
        )


def build_plan(
    inst: Instance, placement: Mapping[str, str], *, optimizer: str = "", defer_above: int | None = None
) -> Plan:
    """The pools that take `inst` to `placement` (vm → node for every VM to be running).

    `defer_above`: an action whose own cost exceeds it (and exceeds the suspends and stops of
    the pool) waits for a later pool, unless the pool would otherwise be empty. A dear action
    in an early pool makes every later action pay for it; deferring it can be cheaper.
    """
    vms = inst.vm_by_id
    load = _Load(
        cpu={n.id: 0 for n in inst.nodes},
        mem={n.id: 0 for n in inst.nodes},
        cap_cpu={n.id: n.cpu for n in inst.nodes},
        cap_mem={n.id: n.mem for n in inst.nodes},
    )
    free_now: list[PlanAction] = []
    migrations: dict[str, PlanAction] = {}  # vm -> pending migration
    resumes: dict[str, list[PlanAction]] = {}  # vjob -> its resumes
    runs: list[PlanAction] = []
    cut = cut_vjobs(inst, placement)
    after_cut: list[list[PlanAction]] = []  # their resumes: from the pool after their suspends
    for vm in inst.vms:
        goal = inst.target_of(vm)
        if vm.state is VJobState.RUNNING:
            assert vm.host is not None
            load.cpu[vm.host] += vm.cpu
            load.mem[vm.host] += vm.mem
            if goal is VJobState.TERMINATED:
                free_now.append(PlanAction(Action.STOP, vm.id, vm.vjob, src=vm.host))
            elif goal is VJobState.SLEEPING or vm.vjob in cut:
                free_now.append(PlanAction(Action.SUSPEND, vm.id, vm.vjob, src=vm.host))
            elif placement[vm.id] != vm.host:
                migrations[vm.id] = PlanAction(Action.MIGRATE, vm.id, vm.vjob, src=vm.host, dst=placement[vm.id])
        elif goal is VJobState.RUNNING and vm.state is VJobState.SLEEPING:
            resumes.setdefault(vm.vjob, []).append(
                PlanAction(Action.RESUME, vm.id, vm.vjob, src=vm.host, dst=placement[vm.id])
            )
        elif goal is VJobState.RUNNING:
            runs.append(PlanAction(Action.RUN, vm.id, vm.vjob, dst=placement[vm.id]))

    for vjob in sorted(cut):
        after_cut.append(
            [PlanAction(Action.RESUME, v.id, vjob, src=v.host, dst=placement[v.id]) for v in inst.vjobs()[vjob]]
        )
    # Dearest first: they gain most from an early pool (every later action pays for its pool).
    runs.sort(key=lambda a: (-vms[a.vm].mem, a.vm))
    groups = sorted(resumes.values(), key=lambda g: (-sum(vms[a.vm].mem for a in g), g[0].vjob))
    pools: list[list[PlanAction]] = []
    budget = 4 * (len(migrations) + len(runs) + len(groups)) + 4
    budget += 4 * len(after_cut)
    while free_now or migrations or runs or groups or after_cut:
        if pools and after_cut:  # the cuts were taken in the first pool: their resumes may go now
            groups.extend(after_cut)
            after_cut = []
        if len(pools) > budget:
            raise SequencingError(f"no viable order found after {len(pools)} pools (migration cycles keep forming)")
        pool = list(free_now)
        free_now = []
        room = _PoolRoom(load)
        forced = max((local_cost(a, vms[a.vm].mem) for a in pool), default=0)
        limit = None if defer_above is None else max(defer_above, forced)
        admitted = _admit_all(migrations, groups, runs, vms, room, limit)
        if not admitted and not pool and limit is not None:
            admitted = _admit_all(migrations, groups, runs, vms, room, None)
        pool.extend(admitted)
        if not pool:
            if not migrations:
                raise SequencingError(
                    "the target placement is not viable: runs or resumes cannot fit even once every VM has left"
                )
            pool.append(_break_cycle(migrations, vms, load, room.cpu, room.mem))
        _apply(pool, vms, load)
        pools.append(pool)

    mem_of = {vm.id: vm.mem for vm in inst.vms}
    frozen = tuple(tuple(p) for p in pools)
    return Plan(pools=frozen, placement=dict(placement), cost=plan_cost(frozen, mem_of), optimizer=optimizer)


def cut_vjobs(inst: Instance, placement: Mapping[str, str]) -> set[str]:
    """The vjobs moved by one cut: those that move only whole, stay running, and whose
    placement puts one of their VMs on another node."""
    out: set[str] = set()
    for vm in inst.vms:
        if vm.vjob not in inst.whole or vm.state is not VJobState.RUNNING:
            continue
        if inst.target_of(vm) is VJobState.RUNNING and placement[vm.id] != vm.host:
            out.add(vm.vjob)
    return out


class _PoolRoom:
    """What the actions admitted so far into the current pool bring onto each node."""

    def __init__(self, load: _Load) -> None:
        self.load = load
        self.cpu = dict.fromkeys(load.cpu, 0)
        self.mem = dict.fromkeys(load.mem, 0)

    def admit(self, a: PlanAction, vm: VMSpec) -> bool:
        """Take room for `a` on its destination if there is some, on top of everything there."""
        assert a.dst is not None
        if not self.load.room(a.dst, vm.cpu, vm.mem, self.cpu[a.dst], self.mem[a.dst]):
            return False
        self.cpu[a.dst] += vm.cpu
        self.mem[a.dst] += vm.mem
        return True

    def save(self, actions: list[PlanAction]) -> dict[str, tuple[int, int]]:
        return {a.dst: (self.cpu[a.dst], self.mem[a.dst]) for a in actions if a.dst is not None}

    def restore(self, saved: dict[str, tuple[int, int]]) -> None:
        for n, (cpu, mem) in saved.items():
            self.cpu[n], self.mem[n] = cpu, mem


def _admit_all(
    migrations: dict[str, PlanAction],
    groups: list[list[PlanAction]],
    runs: list[PlanAction],
    vms: Mapping[str, VMSpec],
    room: _PoolRoom,
    limit: int | None,
) -> list[PlanAction]:
    """Admit into the current pool what fits (migrations, then whole resume groups, then runs).

    Admitted actions are removed from `migrations`, `groups` and `runs` (in place); actions
    dearer than `limit` are left for a later pool.
    """

    def cheap(actions: list[PlanAction]) -> bool:
        return limit is None or all(local_cost(a, vms[a.vm].mem) <= limit for a in actions)

    pool: list[PlanAction] = []
    moved = [
        m
        for m in sorted(migrations.values(), key=lambda a: (-vms[a.vm].mem, a.vm))
        if cheap([m]) and room.admit(m, vms[m.vm])
    ]
    for m in moved:
        del migrations[m.vm]
    pool.extend(moved)
    waiting: list[list[PlanAction]] = []
    for group in groups:
        if not cheap(group):
            waiting.append(group)
            continue
        saved = room.save(group)
        if all(room.admit(a, vms[a.vm]) for a in group):
            pool.extend(group)
        else:
            room.restore(saved)
            waiting.append(group)
    groups[:] = waiting
    started = [r for r in runs if cheap([r]) and room.admit(r, vms[r.vm])]
    if started:
        gone = {r.vm for r in started}
        runs[:] = [r for r in runs if r.vm not in gone]
    pool.extend(started)
    return pool


def _apply(pool: list[PlanAction], vms: Mapping[str, VMSpec], load: _Load) -> None:
    for a in pool:
        vm = vms[a.vm]
        if a.kind in (Action.MIGRATE, Action.STOP, Action.SUSPEND):
            assert a.src is not None
            load.cpu[a.src] -= vm.cpu
            load.mem[a.src] -= vm.mem
        if a.kind in (Action.MIGRATE, Action.RUN, Action.RESUME):
            assert a.dst is not None
            load.cpu[a.dst] += vm.cpu
            load.mem[a.dst] += vm.mem


def _find_cycle(migrations: Mapping[str, PlanAction]) -> list[PlanAction]:
    """A cycle of pending migrations: each one's destination is the next one's source."""
    leaving: dict[str, list[PlanAction]] = {}
    for m in sorted(migrations.values(), key=lambda a: a.vm):
        assert m.src is not None
        leaving.setdefault(m.src, []).append(m)
    for start in sorted(migrations.values(), key=lambda a: a.vm):
        path: list[PlanAction] = []
        seen: dict[str, int] = {}
        cur: PlanAction | None = start
        while cur is not None:
            assert cur.src is not None and cur.dst is not None
            if cur.src in seen:
                return path[seen[cur.src] :]
            seen[cur.src] = len(path)
            path.append(cur)
            nxt = leaving.get(cur.dst)
            cur = nxt[0] if nxt else None
    return []


def _break_cycle(
    migrations: dict[str, PlanAction],
    vms: Mapping[str, VMSpec],
    load: _Load,
    inc_cpu: dict[str, int],
    inc_mem: dict[str, int],
) -> PlanAction:
    """Move one VM of a migration cycle to a pivot node; its migration then starts from the pivot."""
    cycle = _find_cycle(migrations)
    if not cycle:
        raise SequencingError("pending migrations are blocked but form no cycle: the placement is not viable")
    on_cycle = {m.src for m in cycle}
    for m in sorted(cycle, key=lambda a: (vms[a.vm].mem, a.vm)):
        vm = vms[m.vm]
        pivots = [
            n
            for n in load.cpu
            if n not in on_cycle and n != m.dst and load.room(n, vm.cpu, vm.mem, inc_cpu[n], inc_mem[n])
        ]
        if pivots:
            pivot = max(pivots, key=lambda n: (load.cap_mem[n] - load.mem[n], load.cap_cpu[n] - load.cpu[n], n))
            migrations[m.vm] = PlanAction(Action.MIGRATE, m.vm, m.vjob, src=pivot, dst=m.dst)
            return PlanAction(Action.MIGRATE, m.vm, m.vjob, src=m.src, dst=pivot)
    names = ", ".join(f"{m.vm} {m.src}->{m.dst}" for m in cycle)
    raise SequencingError(f"migration cycle [{names}] has no pivot node with room for any of its VMs")
