"""The Entropy control loop in the agent: every `planner.interval_s`, re-plan from measured demand.

Why here: the agent already observes the pilots, and each pilot writes its VM's CPU counter in
its state file (agent.pilot). Two readings give each VM's measured demand; the pure control
step (preemption.planner.control) decides which vjobs run and where, FCFS by submission time;
the planner's switch is carried out live through the pilots (agent.pilot_performer) and
journalled like every switch (`vjob status` lists it with its plan).

Scope: the vjobs that have a pilot (running, or asleep after a live suspend). Starting a new
job stays the RMS's decision; the loop packs, relieves and wakes the vjobs it already holds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent.observe import Observation
from agent.pilot_performer import EXECUTOR_TAG, PilotRequestPerformer
from preemption.executor import ExecutionReport, Executor
from preemption.planner import NodeSpec, Plan
from preemption.planner.control import ControlDecision, ObservedVM, cpu_demand, decide, plan_for
from vjob.model import VJobState
from vjob.pilot_files import PilotState, PilotStatus

if TYPE_CHECKING:
    from agent.loop import Agent


@dataclass
class ControlState:
    """What the loop carries between steps: the last CPU reading and demand of each VM, and
    the last decision and plan (for the log and tests)."""

    readings: dict[str, tuple[float, float]] = field(default_factory=dict)
    demand: dict[str, int] = field(default_factory=dict)
    last_step: float = 0.0
    decision: ControlDecision | None = None
    plan: Plan | None = None


def observed_vms(obs: Observation, state: ControlState, *, busy: float) -> list[ObservedVM]:
    """The vjobs with a pilot, each VM weighing the CPU it used since the previous reading."""
    out = []
    for job_id, st in sorted(obs.pilots.items()):
        saved = st.state is PilotState.SAVED and st.memory_saved
        if not saved and st.state is not PilotState.RUNNING:
            continue
        vcpus = max(1, st.vcpus)
        if saved:
            out.append(ObservedVM(st.vm, job_id, VJobState.SLEEPING, st.saved_node or st.node, max(1, st.memory_mb),
                                  vcpus, state.demand.get(st.vm, vcpus)))  # fmt: skip
            continue
        demand = _demand(st, state, vcpus, busy)
        out.append(ObservedVM(st.vm, job_id, VJobState.RUNNING, st.node, max(1, st.memory_mb), vcpus, demand))
    return out


def _demand(st: PilotStatus, state: ControlState, vcpus: int, busy: float) -> int:
    prev = state.readings.get(st.vm)
    if st.cpu_at <= 0:
        return vcpus  # never measured yet: its requested size
    demand = cpu_demand(st.cpu_seconds, st.cpu_at, *(prev or (None, None)), vcpus, busy=busy)
    if prev is not None and prev[1] == st.cpu_at:
        demand = state.demand.get(st.vm, demand)  # no new reading since: keep the last measurement
    state.readings[st.vm] = (st.cpu_seconds, st.cpu_at)
    state.demand[st.vm] = demand
    return demand


def step(agent: Agent, obs: Observation, state: ControlState) -> ExecutionReport | None:
    """One control step: decide from the measured state, plan, and carry the switch out live."""
    state.last_step = time.time()
    usable = [n for n in obs.view.nodes if n.state.usable]
    nodes = [NodeSpec(n.name, n.cpus, n.memory_mb) for n in usable]
    names = {n.name for n in usable}
    vms = [o for o in observed_vms(obs, state, busy=agent.cfg.planner.busy) if o.host in names]
    if not vms:
        return None
    submitted = {j.id: j.submit_time for j in obs.view.jobs}
    queue = sorted({o.vjob for o in vms}, key=lambda j: (submitted.get(j, 0.0), j))
    state.decision = decide(nodes, vms, queue)
    state.plan = plan = plan_for(state.decision, optimizer=agent.cfg.planner.optimizer,
                                 time_limit_s=min(agent.cfg.planner.time_limit_s, 5.0))  # fmt: skip
    if plan is None:
        return None
    agent.log.info("consolidation planned", overloaded=list(state.decision.overloaded), cost=plan.cost,
                   actions=plan.count(), jobs=sorted({a.vjob for a in plan.actions}))  # fmt: skip
    performer = PilotRequestPerformer(lambda a: agent.pilot_dir(a.vjob), timeout_s=agent.checkpoint_timeout_s,
                                      reason="consolidation")  # fmt: skip
    executor = Executor(performer, agent.store(), tag=EXECUTOR_TAG, job_key=lambda a: f"{agent.rms}:{a.vjob}")
    report = executor.execute(plan, reason="consolidation: measured demand")
    agent.log.info("consolidation done", switch=report.switch_id, summary=report.summary())
    return report


__all__ = ["ControlState", "observed_vms", "step"]
