"""Heterogeneity-aware remapping (ARRIVE-F, Atif & Strazdins; issue 20; docs/remap.md).

Pure functions shared by the simulator (simulator/remap_engine.py) and the agent (agent/remap_step.py,
through `preemption.remap.live`: the RMS view — swaps of equal node counts, home moves; and
`preemption.remap.claims`: what the vjob policy pass acts on in a tick is never remapped;
`preemption.remap.memory`: the balloon target a moved VM gets on its new node kind):

    from preemption.remap import SubCluster, Profile, RemapParams, RunningJob, decide
    from preemption.remap.models import compute_time, blocking_time, nonblocking_time, delta
    d = delta(profile, farm["A"], farm["B"])   # seconds gained per profiling window on B
    job = running_job(..., profile=profile, farm=farm)  # gains towards every other sub-cluster
    decisions = decide(jobs, free_slots={"B": 4}, memory_per_slot={...}, params=RemapParams())
    # Decision(kind "move"|"swap", reason "gain"|"thrashing", jobs, src, dst, gain_s)
"""

from preemption.remap.models import Profile, SubCluster, delta, migration_cost_s
from preemption.remap.policy import Decision, RemapParams, RunningJob, decide, running_job

__all__ = [
    "Decision",
    "Profile",
    "RemapParams",
    "RunningJob",
    "SubCluster",
    "decide",
    "delta",
    "migration_cost_s",
    "running_job",
]
