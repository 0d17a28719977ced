"""The kernel's sections about what is decided: the UBIS priority, the scheduling pass's
policy, the context-switch planner, heterogeneity-aware remapping and deadline admission
(the simulator replays them too, so they are not any one package's).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from vjob.config.section import Section


class PriorityWeights(Section):
    """The UBIS weights w1..w7 (paper defaults), named after the term they scale."""

    usage: float = Field(0.07, ge=0)
    """w1, scales Target−Usage: a user below their share goes first."""
    queue_time: float = Field(0.13, ge=0)
    """w2, scales the time in queue."""
    os_available: float = Field(0.10, ge=0)
    """w3, scales N_availableOS − N_reqOS: nodes already running the job's OS."""
    preempt_count: float = Field(0.10, ge=0)
    """w4, scales Pn, how often the job was preempted."""
    preempt_time: float = Field(0.16, ge=0)
    """w5, scales Pt, how long the job has been preempted in total."""
    free_nodes: float = Field(0.20, ge=0)
    """w6, scales N_free − (N_reqOS − N_availableOS): can it start now."""
    interactive: float = Field(0.24, ge=0)
    """w7, scales I: 1 for an interactive job under the interactive cap."""


class PriorityConfig(Section):
    weights: PriorityWeights = PriorityWeights()
    max_queue_time_s: float = Field(7 * 24 * 3600.0, gt=0)
    """Queue time at which the queue-time term saturates at 1 (like Slurm's PriorityMaxAge)."""
    max_preempt_count: int = Field(5, ge=1)
    """Preemption count (Pn) at which the preempt-count term saturates at 1."""
    max_preempt_time_s: float = Field(24 * 3600.0, gt=0)
    """Total preempted time (Pt) at which the preempt-time term saturates at 1."""
    usage_half_life_s: float = Field(7 * 24 * 3600.0, gt=0)
    """Half-life of the exponential decay of recorded usage (node-seconds)."""
    interactive_cap: float = Field(0.15, ge=0, le=1)
    """Largest share of the nodes interactive jobs may hold before their I term drops to 0."""
    interactive_user_cap: float | None = Field(None, ge=0, le=1)
    """Optional share of the nodes one user's interactive jobs may hold."""
    targets: dict[str, float] = Field(default_factory=dict)
    """Target share per user (0..1); users not listed share what is left equally."""
    account_targets: dict[str, float] = Field(default_factory=dict)
    """Target share per account (0..1)."""

    @field_validator("targets", "account_targets")
    @classmethod
    def _shares(cls, value: dict[str, float]) -> dict[str, float]:
        for name, share in value.items():
            if not 0 <= share <= 1:
                raise ValueError(f"target of {name!r} = {share}: must be between 0 and 1")
        if sum(value.values()) > 1 + 1e-9:
            raise ValueError(f"targets add up to {sum(value.values()):.3f}: must be at most 1")
        return value


class SchedulingConfig(Section):
    """The scheduling pass's policy (preemption/scheduling/tick.decide), for the agent and
    `vjob simulate` alike. docs/policy.md explains the policies and why vjob is the default."""

    policy: Literal["vjob", "ubis", "mms", "mms-block", "fcfs-easy"] = "vjob"
    """Queue order and preemption rule: vjob (interactive jobs first, may checkpoint batch jobs
    by cost while the queue head's reservation holds), ubis (the paper's priority order),
    mms, mms-block, fcfs-easy (no preemption)."""
    tier_order: Literal["submit", "ubis", "ubis-interactive"] = "submit"
    """vjob, the order inside each tier: submit = submission time; ubis = the UBIS priority
    (the `[priority]` weights and each user's fair share), highest first; ubis-interactive =
    the UBIS priority inside the interactive tier only, the other tiers by submission. Not the
    default: on the 100,000-job Lublin grid ubis makes large batch jobs wait 1.7-4.6 x MMS, and
    ubis-interactive lowers the admitted interactive wait by 5-16 % but lengthens batch
    response in 5 of 12 cells (docs/policy.md "Interactive start at scale")."""
    max_preemptions: int = Field(2, ge=0, le=1000)
    """vjob: a batch job checkpointed this many times is no longer a victim (0 = never preempt)."""
    head_slack_s: float = Field(600.0, ge=0)
    """vjob: seconds an interactive job's preemption may push back the reserved start of the
    first batch job in the queue; beyond that the interactive job waits (reserves) instead."""
    interactive_ahead: Literal["off", "backfill", "queue", "guarded"] = "backfill"
    """vjob, interactive jobs beyond the cap (they neither preempt nor count against it): off =
    they queue with the batch jobs by submission time; backfill = that too, but EASY looks at
    them first when it backfills; queue = they queue ahead of every batch job (and can become
    the head); guarded = they are looked at before the batch jobs and start when they fit and
    keep the first batch job's reservation within head_slack_s, but never hold a reservation."""
    victims: Literal["cost", "guard", "fallback"] = "cost"
    """vjob, the order victims are taken in: cost = fewest earlier preemptions, nodes on the
    image, smallest checkpoint; guard = first those whose return would not move the first batch
    job's reserved start (they end after it, or are back and done before it), then by cost
    (shorter interactive waits, but more preemptions cost batch work; docs/policy.md);
    fallback = by cost, and when the guard refuses those, once more in guard's order."""
    interactive_reserve_nodes: int = Field(0, ge=0, le=1_000_000)
    """vjob: free nodes kept for interactive jobs not yet arrived (0 = off): other jobs start,
    and are backfilled, only if they leave this many free (at most the cap's room; a job larger
    than the machine minus the reserve is not held to it), and the queue head's EASY
    reservation counts them (preemption/scheduling/reserve.py). Costs batch work on the Lublin
    grid, hence off (docs/policy.md)."""
    interactive_reserve_arrivals: int = Field(0, ge=0, le=1_000_000)
    """vjob: hold `interactive_reserve_nodes` only while at least this many interactive jobs
    submitted within the last `interactive_reserve_window_s` are queued or running (0 = always;
    preemption/scheduling/reserve.py, docs/policy.md)."""
    interactive_reserve_window_s: float = Field(3600.0, gt=0, le=30 * 24 * 3600)
    """vjob: the window of `interactive_reserve_arrivals`, in seconds."""


class PlannerConfig(Section):
    optimizer: Literal["cpsat", "ffd"] = "cpsat"
    """cpsat: OR-Tools CP-SAT minimises the plan cost; ffd: first-fit decreasing baseline."""
    time_limit_s: float = Field(10.0, gt=0, le=3600)
    """Wall-clock budget of one planning, model building included: CP-SAT improves on the best
    heuristic placement until then, and the plan comes from the heuristics alone when it is
    too short for the solver."""
    interval_s: float = Field(0.0, ge=0, le=86400)
    """The agent's control loop (Entropy): every this many seconds it re-plans the vjobs it holds
    from the CPU and memory demand it measures (libvirt) and carries the switch out live; 0 turns
    the loop off."""
    busy: float = Field(0.5, gt=0, le=1)
    """Share of an interval a vCPU must want — compute, or wait for a host CPU (starved, not idle) —
    to count as busy (one CPU of demand), measured by the agent through libvirt."""


class RemapConfig(Section):
    """Heterogeneity-aware remapping (ARRIVE-F; preemption/remap, docs/remap.md): the paper's
    β and τ, the gain threshold and the guards against ping-pong."""

    beta: float = Field(20.0, gt=0, le=10_000)
    """Profiling windows a predicted gain is counted over (the paper's β)."""
    tau_s: float = Field(50.0, gt=0, le=86_400)
    """Seconds of one profiling window (the paper's τ); a job is profiled a whole window on its
    sub-cluster before it can be moved for gain."""
    threshold_s: float = Field(60.0, allow_inf_nan=False)
    """A move or swap is made only when its predicted gain (VM-seconds, migration cost
    deducted) exceeds this."""
    max_migrations: int = Field(2, ge=0, le=1000)
    """Migrations per job at most (thrashing moves included): no ping-pong."""
    thrash_pages_s: float = Field(1000.0, ge=0)
    """Pages swapped in per second above which a guest thrashes and is moved at once."""
    migrate_bandwidth_mb_s: float = Field(110.0, gt=0)
    """Bandwidth of a live migration (MB/s), for its cost: memory × 1.2 / bandwidth."""
    farm_file: str = ""
    """Sub-cluster file (the `[[subcluster]]` entries of `vjob simulate --subclusters`): set, the
    agent remaps running vjobs live every tau_s (swaps only, docs/remap.md); empty: off."""
    partner_hold_s: float = Field(25.0, ge=0, le=600)
    """A pilot whose job ends while a swap has its VM away waits at most this long (read by the
    pilot) for the agent to send the partner's VM, still on its own node, home before it lets the
    RMS free the node; then it ends anyway (logged). 0: no wait. Keep it below Slurm's KillWait."""


class DeadlineConfig(Section):
    """Deadline-aware admission (docs/deadline.md): a job is accepted, or kept running, while its
    x-factor (how late it is projected to end, as a share of what it has left) is below X."""

    admission: str = Field("none", pattern=r"^(none|static|adaptive|cdf)$")
    """How X is set: none (no deadline policy), static, adaptive (towards target_failure) or cdf
    (from past jobs' headroom so that cdf_probability of them would succeed)."""
    action: str = Field("cancel", pattern=r"^(cancel|checkpoint)$")
    """A running vjob over X: cancel it, or checkpoint it and resume it where it can still finish."""
    buffer: float = Field(0.05, ge=0, le=10)
    """Deadline slack given to replayed trace jobs: deadline = submit + (1 + buffer) × requested time."""
    static_x: float = Field(0.1, ge=-1, le=10)
    """X for `static`, and the starting X of `adaptive` and `cdf`."""
    x_min: float = Field(0.1, ge=-1, le=10)
    """Lowest X the adaptive and cdf thresholds may reach."""
    x_max: float = Field(0.9, ge=-1, le=10)
    """Highest X the adaptive and cdf thresholds may reach."""
    delta_x: float = Field(0.05, ge=0, le=1)
    """Adaptive step: X moves by delta_x × |target − measured failure rate| per finished job."""
    target_failure: float = Field(0.15, ge=0, le=1)
    """Failure rate the adaptive threshold steers to."""
    cdf_probability: float = Field(0.8, gt=0, le=1)
    """cdf: share of past jobs that would have met their deadline at x = X."""
    window: int = Field(100, ge=1, le=100_000)
    """Finished jobs in the measured failure rate (and, ×20, headroom samples for cdf)."""
    threshold_file: str = ""
    """Where the agent publishes X for the submit hooks; empty: vjob-deadline.threshold beside
    slurm.conf (Slurm) — the hook reads it and refuses jobs with x >= X."""
    stale_after_s: float = Field(600.0, gt=0, le=86400)
    """A threshold file older than this is ignored by the hooks (they accept every job)."""
    checkpoint_s: float = Field(120.0, ge=0, le=86400)
    """Wall seconds a checkpoint and its restore cost a vjob: counted in its x when the agent
    weighs checkpointing it for its deadline and releasing it afterwards (the simulator's 120 s)."""
    vo_min_samples: int = Field(20, ge=1, le=100_000)
    """Finished jobs of a kind needed before the learned VO model replaces the configured one."""
    vo_max_slowdown: float = Field(3.0, ge=1, le=100)
    """Largest slowdown one finished job may show in the VO fit (actual / time limit is clipped
    to [1, this]): bounds what one hostile or absurd job can move the model."""
    vo_observations: int = Field(1000, ge=1, le=5000)
    """Newest finished-job observations the VO model is refitted from (the store keeps 5,000)."""

    @model_validator(mode="after")
    def _bounds(self) -> DeadlineConfig:
        if self.x_min > self.x_max:
            raise ValueError(f"x_min = {self.x_min} > x_max = {self.x_max}: need x_min <= x_max")
        return self
