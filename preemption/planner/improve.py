"""A cheap improvement phase on a sequenced plan: pull late actions into earlier pools.

Why after sequencing and not in the placement: on crowded clusters (1,000 nodes / 5,000 VMs,
nearly full after the decision) most of a plan's cost is not the actions' own costs but what
they pay for the pools before them: measured on the benchmark's large instances (seeds 1-3),
about two thirds of the cost was waiting, mostly runs and resumes sent to a node that only
had room after other VMs left while other nodes had room earlier, and resume groups held back
behind a dear pool. Knowing the pools, the room on every node during every pool is known
exactly, so a run, a migration (not one through a pivot) or a whole resume group (a vjob wakes
up in one pool) can be moved to an earlier pool onto nodes that have room from that pool to
the end, preferring the node that holds a VM's state (a local resume); a remote resume may
also become local in its own pool. A move is made only when it cannot raise the cost: the
earlier pool's dearest action stays the dearest (so no pool gets dearer), and the pools saved
outweigh any extra local cost (a remote resume). The pool left behind can only get cheaper.
The result is validated by the caller like every plan.
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np

from preemption.planner.instance import Instance
from preemption.planner.plan import Plan, PlanAction, local_cost, plan_cost
from vjob.model import Action, VJobState


def pull_forward(inst: Instance, plan: Plan, deadline: float | None = None) -> Plan:
    """`plan` with late runs, migrations and resume groups moved to earlier pools where room allows; never dearer.

    Stops early (keeping the moves made so far) when `deadline` (a time.perf_counter() value)
    passes. Returns `plan` itself when nothing was moved.
    """
    pools = [list(p) for p in plan.pools]
    if len(pools) < 2 or (deadline is not None and time.perf_counter() > deadline):
        return plan
    room = _Room(inst, pools)
    mem_of = {v.id: v.mem for v in inst.vms}
    pool_max = [max((local_cost(a, mem_of[a.vm]) for a in pool), default=0) for pool in pools]
    placement = dict(plan.placement)
    moved = 0
    actions_of = Counter(a.vm for pool in pools for a in pool)
    # A VM with an earlier action (a vjob moved by one cut: suspended, then resumed) may act
    # again only from the pool after it.
    after = {a.vm: p + 1 for p, pool in enumerate(pools) for a in pool if a.kind is Action.SUSPEND}
    for k in range(len(pools) - 1, -1, -1):
        # The units to move: each run or migration alone (not a VM that migrates twice, via a
        # pivot: its order matters), each vjob's resumes together; dearest first.
        units: dict[str, list[PlanAction]] = {}
        for a in pools[k]:
            if a.kind is Action.RUN or (a.kind is Action.MIGRATE and actions_of[a.vm] == 1):
                units[a.vm] = [a]
            elif a.kind is Action.RESUME:
                units.setdefault("vjob:" + a.vjob, []).append(a)
        order = sorted(units.values(), key=lambda u: (-max(local_cost(a, mem_of[a.vm]) for a in u), u[0].vm))
        for unit in order:
            if deadline is not None and time.perf_counter() > deadline:
                break
            new = _earliest(inst, unit, k, pool_max, room, max(after.get(a.vm, 0) for a in unit))
            if new is None:
                continue
            j, actions = new
            gone = {a.vm for a in unit}
            pools[k] = [a for a in pools[k] if a.vm not in gone]
            pools[j].extend(actions)
            for a in actions:
                assert a.dst is not None
                placement[a.vm] = a.dst
            moved += len(actions)
        pool_max = [max((local_cost(a, mem_of[a.vm]) for a in pool), default=0) for pool in pools]
    if not moved:
        return plan
    kept = tuple(tuple(p) for p in pools if p)
    cost = plan_cost(kept, mem_of)
    if cost >= plan.cost:
        return plan
    stats = {**plan.stats, "pulled_forward": moved}
    return Plan(
        pools=kept, placement=placement, cost=cost, optimizer=plan.optimizer, warnings=plan.warnings, stats=stats
    )


class _Room:
    """What every node holds during every pool (departures of a pool still count in it); row P: the end."""

    def __init__(self, inst: Instance, pools: list[list[PlanAction]]) -> None:
        self.ids = [n.id for n in inst.nodes]
        self.col = {n: i for i, n in enumerate(self.ids)}
        self.cap_cpu = np.array([n.cpu for n in inst.nodes], dtype=np.int64)
        self.cap_mem = np.array([n.mem for n in inst.nodes], dtype=np.int64)
        shape = (len(pools) + 1, len(self.ids))
        self.cpu = np.zeros(shape, dtype=np.int64)
        self.mem = np.zeros(shape, dtype=np.int64)
        self.vms = inst.vm_by_id
        vms = self.vms
        for vm in inst.vms:
            if vm.state is VJobState.RUNNING and vm.host is not None:
                self.add(self.col[vm.host], 0, vm.cpu, vm.mem)
        for p, pool in enumerate(pools):
            for a in pool:
                vm = vms[a.vm]
                if a.dst is not None:  # run, resume, the arrival of a migration
                    self.add(self.col[a.dst], p, vm.cpu, vm.mem)
                if a.kind in (Action.MIGRATE, Action.SUSPEND, Action.STOP):
                    assert a.src is not None
                    self.add(self.col[a.src], p + 1, -vm.cpu, -vm.mem)

    def add(self, node: int, p: int, cpu: int, mem: int) -> None:
        """A VM arriving on `node` in pool p stays there to the end (negative: it leaves)."""
        self.cpu[p:, node] += cpu
        self.mem[p:, node] += mem

    def fits(self, node: int, p: int, cpu: int, mem: int) -> bool:
        """Room on `node` for one more VM from pool p to the end."""
        return bool(
            np.all(self.cpu[p:, node] + cpu <= self.cap_cpu[node])
            and np.all(self.mem[p:, node] + mem <= self.cap_mem[node])
        )

    def any_fit(self, p: int, cpu: int, mem: int, avoid: str | None = None) -> int | None:
        """The node with the least memory left among those with room from pool p to the end, or None."""
        free_cpu = (self.cap_cpu - self.cpu[p:]).min(axis=0)
        free_mem = (self.cap_mem - self.mem[p:]).min(axis=0)
        if avoid is not None:
            free_cpu[self.col[avoid]] = -1
        ok = np.flatnonzero((free_cpu >= cpu) & (free_mem >= mem))
        return None if ok.size == 0 else int(ok[np.argmin(free_mem[ok])])


def _earliest(
    inst: Instance, unit: list[PlanAction], k: int, pool_max: list[int], room: _Room, first: int = 0
) -> tuple[int, list[PlanAction]] | None:
    """The earliest pool j (`first` <= j <= k) that takes the whole unit without a dearer pool, for a net
    gain, and its actions.

    The unit's arrivals in pool k are taken out of the room first, and put back if no move pays.
    """
    vms = inst.vm_by_id
    mem_of = {a.vm: vms[a.vm].mem for a in unit}
    col = room.col
    for a in unit:
        _footprint(room, a, col[a.dst] if a.dst is not None else -1, k, -1)
    old_local = sum(local_cost(a, mem_of[a.vm]) for a in unit)
    # j == k: the same pool, worth it only when resumes become local (saved is 0 there).
    for j in range(first, k + 1):
        saved = len(unit) * sum(pool_max[j:k])
        placed: list[tuple[PlanAction, int]] = []
        for a in sorted(unit, key=lambda x: (-mem_of[x.vm], x.vm)):
            vm = vms[a.vm]
            assert a.dst is not None
            # The node holding the state first (a local resume), then where it was going, then any.
            choices = ([col[a.src]] if a.kind is Action.RESUME and a.src in col else []) + [col[a.dst]]
            if vm.pinned:
                assert vm.host is not None
                choices = [col[vm.host]]  # a pinned VM only ever arrives at its own node
            node = next((n for n in choices if room.fits(n, j, vm.cpu, vm.mem)), None)
            if node is None and not vm.pinned:
                node = room.any_fit(j, vm.cpu, vm.mem, avoid=a.src if a.kind is Action.MIGRATE else None)
            if node is None:
                break
            _footprint(room, a, node, j, 1)
            placed.append((a, node))
        actions = [PlanAction(a.kind, a.vm, a.vjob, src=a.src, dst=room.ids[n]) for a, n in placed]
        costs = [local_cost(x, mem_of[x.vm]) for x in actions]
        if len(placed) == len(unit) and max(costs) <= pool_max[j] and saved > sum(costs) - old_local:
            return j, actions
        for a, n in placed:
            _footprint(room, a, n, j, -1)
    for a in unit:
        _footprint(room, a, col[a.dst] if a.dst is not None else -1, k, 1)
    return None


def _footprint(room: _Room, a: PlanAction, node: int, p: int, sign: int) -> None:
    """Add (sign 1) or take out (-1) action `a` arriving on `node` in pool p: a migration also
    leaves its source after pool p."""
    vm = room.vms[a.vm]
    room.add(node, p, sign * vm.cpu, sign * vm.mem)
    if a.kind is Action.MIGRATE:
        assert a.src is not None
        room.add(room.col[a.src], p + 1, -sign * vm.cpu, -sign * vm.mem)
