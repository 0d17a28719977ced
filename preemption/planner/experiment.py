"""The paper's cluster experiment (Entropy section 5.2), simulated: FCFS static allocation
against the control loop with measured demand and cluster-wide context switches.

Why a simulation: the paper ran 8 vjobs of 9 VMs (NASGrid tasks) on 11 nodes of 2 CPUs for
hours; this machine has 2 cores. The simulation runs the real decision and planner
(preemption.planner.control, make_plan) on a synthetic workload of the same shape: each vjob
is a sequence of stages, in each stage some of its VMs compute (one CPU each) and the others
wait. The application advances only while all its VMs run, at the speed of its slowest
computing VM (a node with more computing VMs than CPUs shares them). A context switch takes
the time of its pools (each as long as its longest action), during which the vjobs it touches
make no progress.

- `fcfs`: the static allocation the paper compares with — a vjob books one CPU and its memory
  per VM for its whole run; vjobs start in submission order as soon as they fit.
- `entropy`: every `interval_s`, the measured demand of every VM (1 computing, 0 waiting; a
  waiting vjob counts its requested size), the FCFS decision module (sticky), the planner, and
  the switch's duration from the action durations below.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from preemption.planner.control import ObservedVM, decide, plan_for
from preemption.planner.instance import NodeSpec
from preemption.planner.optimizer import Optimizer
from preemption.planner.plan import Plan
from vjob.model import Action, VJobState


@dataclass(frozen=True)
class ActionTimes:
    """Seconds per action (Entropy section 2.3 measured suspend/resume ≫ migrate ≫ run/stop)."""

    run_stop_s: float = 5.0
    migrate_mb_s: float = 100.0
    save_mb_s: float = 35.0
    """Suspend and local resume write or read the memory at this rate; a remote resume copies it first."""

    def seconds(self, kind: Action, mem: int, local: bool) -> float:
        if kind in (Action.RUN, Action.STOP):
            return self.run_stop_s
        if kind is Action.MIGRATE:
            return 2.0 + mem / self.migrate_mb_s
        if kind is Action.RESUME and not local:
            return 2.0 + 2 * mem / self.save_mb_s
        return 2.0 + mem / self.save_mb_s


@dataclass(frozen=True)
class VJobWork:
    """One vjob: its VMs' memory and its stages (seconds, indexes of the VMs computing)."""

    name: str
    mems: tuple[int, ...]
    stages: tuple[tuple[float, frozenset[int]], ...]


def workload(seed: int, *, vjobs: int = 8, vms: int = 9) -> list[VJobWork]:
    """The paper's shape: vjobs of 9 VMs of 512–2048 MB, NASGrid-like stages of 2–10 minutes
    in which 1 to all of the VMs compute."""
    rng = random.Random(seed)
    out = []
    for j in range(vjobs):
        mems = tuple(rng.choice((512, 1024, 2048)) for _ in range(vms))
        stages = []
        for _ in range(rng.randint(4, 8)):
            width = rng.choice((1, 2, 3, vms // 2, vms))
            stages.append((float(rng.randint(120, 600)), frozenset(rng.sample(range(vms), width))))
        out.append(VJobWork(f"j{j}", mems, tuple(stages)))
    return out


@dataclass
class _Job:
    work: VJobWork
    state: VJobState = VJobState.WAITING
    hosts: list[str | None] = field(default_factory=list)
    stage: int = 0
    done_in_stage: float = 0.0
    blocked_until: float = 0.0
    finished_at: float | None = None

    def computing(self) -> frozenset[int]:
        return self.work.stages[self.stage][1] if self.stage < len(self.work.stages) else frozenset()


@dataclass
class ExperimentResult:
    policy: str
    completion_s: float
    switches: int = 0
    switch_seconds: list[float] = field(default_factory=list)
    actions: dict[str, int] = field(default_factory=dict)
    cpu_busy_share: float = 0.0
    """Mean share of the cluster's CPUs doing useful work until the last vjob ended."""


def simulate(
    policy: str,
    jobs: list[VJobWork],
    *,
    nodes: int = 11,
    cpus: int = 2,
    mem: int = 4096,
    interval_s: float = 30.0,
    dt: float = 5.0,
    optimizer: Optimizer = "cpsat",
    time_limit_s: float = 1.0,
    times: ActionTimes | None = None,
    horizon_s: float = 7 * 24 * 3600,
) -> ExperimentResult:
    """Run the set of vjobs (all submitted at 0, in list order) until the last one ends."""
    if policy not in ("fcfs", "entropy"):
        raise ValueError(f"policy = {policy!r}: must be fcfs or entropy")
    times = times or ActionTimes()
    specs = tuple(NodeSpec(f"n{i:02d}", cpus, mem) for i in range(nodes))
    state = [_Job(w, hosts=[None] * len(w.mems)) for w in jobs]
    result = ExperimentResult(policy, 0.0)
    now, next_step, busy_sum = 0.0, 0.0, 0.0
    while any(j.finished_at is None for j in state):
        if now > horizon_s:
            raise RuntimeError(f"{policy}: not finished after {horizon_s:.0f} s")
        if now >= next_step:
            if policy == "fcfs":
                _fcfs_start(state, specs, now, times)
            else:
                _entropy_step(state, specs, now, times, result, optimizer, time_limit_s)
            next_step = now + (interval_s if policy == "entropy" else dt)
        busy_sum += _advance(state, specs, now, dt)
        now += dt
        for j in state:
            if j.finished_at is None and j.stage >= len(j.work.stages):
                j.finished_at = now
                j.state = VJobState.TERMINATED
                j.hosts = [None] * len(j.hosts)
    result.completion_s = max(j.finished_at or 0.0 for j in state)
    result.cpu_busy_share = round(busy_sum / (result.completion_s * nodes * cpus), 4)
    return result


def _advance(state: list[_Job], specs: tuple[NodeSpec, ...], now: float, dt: float) -> float:
    """dt seconds of progress; returns CPU-seconds of useful work done."""
    demand: dict[str, int] = {n.id: 0 for n in specs}
    for j in state:
        if j.state is VJobState.RUNNING:
            for i in j.computing():
                host = j.hosts[i]
                if host is not None:
                    demand[host] += 1
    cpu = {n.id: n.cpu for n in specs}
    useful = 0.0
    for j in state:
        if j.state is not VJobState.RUNNING or now < j.blocked_until:
            continue
        speeds = [min(1.0, cpu[h] / demand[h]) for i in j.computing() if (h := j.hosts[i]) is not None]
        speed = min(speeds, default=1.0)
        j.done_in_stage += dt * speed
        useful += dt * speed * len(j.computing())
        if j.done_in_stage >= j.work.stages[j.stage][0]:
            j.stage += 1
            j.done_in_stage = 0.0
    return useful


def _fcfs_start(state: list[_Job], specs: tuple[NodeSpec, ...], now: float, times: ActionTimes) -> None:
    """Static allocation: one CPU and the memory per VM, booked from start to end, in order."""
    free = {n.id: [n.cpu, n.mem] for n in specs}
    for j in state:
        if j.state is VJobState.RUNNING:
            for i, h in enumerate(j.hosts):
                if h is not None:
                    free[h][0] -= 1
                    free[h][1] -= j.work.mems[i]
    for j in state:
        if j.state is VJobState.TERMINATED or j.state is VJobState.RUNNING:
            continue
        hosts: list[str | None] = []
        trial = {k: list(v) for k, v in free.items()}
        for m in j.work.mems:
            spot = next((n for n in sorted(trial) if trial[n][0] >= 1 and trial[n][1] >= m), None)
            if spot is None:
                break
            trial[spot][0] -= 1
            trial[spot][1] -= m
            hosts.append(spot)
        if len(hosts) < len(j.work.mems):
            return  # FCFS: nobody overtakes the head of the queue
        free = trial
        j.hosts, j.state, j.blocked_until = hosts, VJobState.RUNNING, now + times.run_stop_s


def _entropy_step(
    state: list[_Job],
    specs: tuple[NodeSpec, ...],
    now: float,
    times: ActionTimes,
    result: ExperimentResult,
    optimizer: Optimizer,
    time_limit_s: float,
) -> None:
    live = [j for j in state if j.state is not VJobState.TERMINATED]
    if any(now < j.blocked_until for j in live):
        return  # a switch is still under way
    observed = []
    for j in live:
        busy = j.computing()
        for i, m in enumerate(j.work.mems):
            demand = 1 if j.state is VJobState.WAITING or i in busy else 0
            observed.append(ObservedVM(f"{j.work.name}-{i}", j.work.name, j.state, j.hosts[i], m, 1, demand))
    decision = decide(specs, observed, [j.work.name for j in live])
    plan = plan_for(decision, optimizer=optimizer, time_limit_s=time_limit_s)
    if plan is None:
        return
    duration = _duration(plan, {o.vm: o.mem for o in observed}, times)
    result.switches += 1
    result.switch_seconds.append(round(duration, 1))
    for kind, n in plan.count().items():
        result.actions[kind] = result.actions.get(kind, 0) + n
    by_name = {j.work.name: j for j in live}
    touched = {a.vjob for a in plan.actions}
    for j in live:
        target = decision.selection.target[j.work.name]
        j.state = target
        for i in range(len(j.hosts)):
            vm = f"{j.work.name}-{i}"
            if target is VJobState.RUNNING:
                j.hosts[i] = plan.placement[vm]
        if j.work.name in touched:
            by_name[j.work.name].blocked_until = now + duration


def _duration(plan: Plan, mem: dict[str, int], times: ActionTimes) -> float:
    return sum(max(times.seconds(a.kind, mem[a.vm], a.local) for a in pool) for pool in plan.pools)


__all__ = ["ActionTimes", "ExperimentResult", "VJobWork", "simulate", "workload"]
