"""The state of one vjob-engine replay, as small records, and the builders that make them.

Why records: the replay's state was 88 attributes of one class, read by the event loop, the
scheduling pass and the preemption alike; grouped by what they hold (the rules resolved
once, the per-job tables, the nodes, the queue, the usage ledger, the current pass's guard
bookkeeping, the pass's scratch arrays) each part has one place and one docstring.
Why lists beside arrays: 100,000 jobs must replay in seconds, so per-job state the loop
reads one job at a time lives in Python lists (fast scalar access), and NumPy arrays mirror
what the queue orders and backfilling read vectorised.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from preemption.scheduling.policies import Policy, check_cap_mode, policy_named
from simulator.node_pool import FREE
from simulator.replay import ClusterModel
from simulator.workload import Workload
from ubis_priority.compiled import (
    COLUMNS,
    INTERACTIVE,
    NODES,
    OS,
    PREEMPT_COUNT,
    PREEMPTED_S,
    SHARE,
    SINCE,
    SUBMIT,
    scalars,
)
from ubis_priority.interactive import cap_limit
from ubis_priority.shares import target_shares
from vjob.config import PriorityConfig, SchedulingConfig
from vjob.errors import InputError

MIB = 1024 * 1024
NONE_QUEUED = 1 << 62
"""`Queue.smallest` when nothing is queued."""


@dataclass(slots=True)
class Rules:
    """What the policy, the configuration and the model ask of the replay, resolved once."""

    policy: Policy
    by_cost: bool
    """vjob: victims by cost, bounded preemptions, the guard's reservation kept (tick.decide)."""
    max_preemptions: int
    head_slack_s: float
    ahead: str
    """`[scheduling] interactive_ahead`."""
    guarded: bool
    harmless_first: bool
    fallback: bool
    reserve_nodes: int
    """vjob: `[scheduling] interactive_reserve_nodes` (preemption/scheduling/reserve.py)."""
    reserve_arrivals: int
    reserve_window_s: float
    hard_cap: bool
    prio_cfg: PriorityConfig
    conf: np.ndarray
    """The priority configuration's scalars, as the compiled UBIS kernel reads them."""
    cap_nodes: float
    ubis_tiers: bool = False
    """vjob: `[scheduling] tier_order = "ubis"` (each tier by UBIS priority, not submission)."""
    ubis_interactive: bool = False
    """vjob: `[scheduling] tier_order = "ubis-interactive"` (the interactive tier by UBIS
    priority, the other tiers by submission)."""
    full_sort_vjob: bool = False
    """vjob: rank the queue with `np.lexsort` at every pass (`policies.vjob_order`, the same
    order as `vjob_order.vjob_queue_order`; bench/simulate.py's baseline)."""


@dataclass(slots=True)
class JobTable:
    """Per job (index = position in submission order): what it asks for, and the state of it
    that changes as it runs, is checkpointed and resumes."""

    submit: list[float]
    need: list[int]
    os: list[int]
    inter: list[bool]
    ckpt_s: list[float]
    """Seconds to write (or read back locally) its checkpoint."""
    mem_bytes: list[float]
    remaining: list[float]
    est_left: list[float]
    est_a: np.ndarray
    submit_a: np.ndarray
    need_a: np.ndarray
    inter_a: np.ndarray
    cols: np.ndarray
    """The columns the compiled UBIS kernel reads, one row per job (a job's columns share a
    cache line); Pn, Pt and the open preemption's start are updated in place."""
    pc_a: np.ndarray
    pt_a: np.ndarray
    since_a: np.ndarray
    prev_nodes: list[np.ndarray | None]
    """The nodes it was checkpointed on (None: never checkpointed)."""
    token: list[int]
    """Invalidates the END events of runs that were checkpointed."""


@dataclass(slots=True)
class Outcome:
    """Per job: what the Result reports."""

    first_start: list[float]
    end: list[float]
    overhead: list[float]
    privileged: list[bool]
    fit_wait: list[float]


@dataclass(slots=True)
class Cluster:
    """The nodes and who holds them. Nodes start with the images in turn (50/50 for two);
    `owner` is the job index on the node, FREE, or CHECKPOINTING while a victim's memory is
    being written."""

    node_os: np.ndarray
    owner: np.ndarray
    free: int
    free_by_os: np.ndarray
    """Free nodes per current OS image, kept up to date as nodes are taken and freed."""
    free_blk: np.ndarray
    """Free nodes per (image, block of 64 nodes), so a start reads only blocks with free
    nodes (node_pool.py); no blocks until the first start builds it from `owner`."""
    running: dict[int, tuple[float, float, np.ndarray]] = field(default_factory=dict)
    """Running job -> (alloc time, run start, nodes)."""
    holds: dict[tuple[int, int], tuple[float, int]] = field(default_factory=dict)
    """What holds nodes (running jobs, checkpoints being written): key -> (estimated end,
    nodes); `held` has the same values kept sorted, as EASY's reservation reads them."""
    held: list[tuple[float, int]] = field(default_factory=list)
    pending_release: dict[int, np.ndarray] = field(default_factory=dict)
    """Victims' nodes their preemptor does not take, free again when the checkpoint ends."""
    batch_running_nodes: int = 0
    held_interactive: int = 0


@dataclass(slots=True)
class Queue:
    """The queued jobs: the buffer as of the last pass (queue_rows: job indices, and for
    exact ubis their rows; `arrived` holds the jobs queued since), the sizes queued (for
    `_may_start`), the interactive jobs waiting (for their admitted wait), and with
    `priority_refresh_s` > 0 the last ranking."""

    jobs: np.ndarray
    rows: np.ndarray
    length: int = 0
    arrived: list[int] = field(default_factory=list)
    sizes: dict[int, int] = field(default_factory=dict)
    smallest: int = NONE_QUEUED
    """The smallest size in `sizes`."""
    interactive: dict[int, int] = field(default_factory=dict)
    """Sizes of the queued interactive jobs (size -> count), for `_may_start`."""
    waiting: dict[int, dict[int, None]] = field(default_factory=dict)
    """Queued interactive jobs that never started, by size (`_cap_moved` walks them)."""
    fit_since: list[float] = field(default_factory=list)
    """Per queued interactive job: since when it fits under the cap (nan: it does not)."""
    prio: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """priority_refresh_s > 0: each job's last priority."""
    ranked: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    """priority_refresh_s > 0: the queue ranked by `prio`."""
    rated_at: float = -math.inf
    """priority_refresh_s > 0: when the whole queue was last rated."""


@dataclass(slots=True)
class Scratch:
    """Buffers of the workload's size, so a pass allocates nothing that large: the outputs
    of the compiled ubis pass (ubis_leading, backfill_leading) and of the vjob order, and
    marks (`mark[-2]`, `mark[-1]`, for CHECKPOINTING and FREE owners, stay False)."""

    lead_jobs: np.ndarray
    lead_entries: np.ndarray
    lead_prio: np.ndarray
    late: np.ndarray
    mark: np.ndarray
    rank: np.ndarray
    vorder: np.ndarray
    vtier: np.ndarray
    vrest: np.ndarray
    vprio: np.ndarray
    """vjob: each queued job's UBIS priority at the pass, by job index (`vjob_queue_order`)."""


@dataclass(slots=True)
class Ledger:
    """Each user's decayed usage and target share (the Target - Usage term of UBIS)."""

    usage: np.ndarray
    usage_t: float
    half_life: float
    target: np.ndarray
    share_list: list[int]
    """Per job: its user's index in `usage` and `target`."""


@dataclass(slots=True)
class PassBook:
    """vjob: what the current pass keeps about its guard (tick's PassState alike)."""

    reserve_asked: int
    """The reserve held in the current pass (`_schedule` sets it when it adapts)."""
    guard: int = -1
    """The first job of the pass's order that is not a privileged interactive job."""
    anchors: dict[int, float] = field(default_factory=dict)
    """Each guarded job's reserved start when first checked (guard.keeps_reservation)."""
    returning: list[tuple[float, int]] = field(default_factory=list)
    """This pass's victims as they will hold nodes again (guard.returning)."""
    covered: list[tuple[float, int]] = field(default_factory=list)
    """The holds those returns stand for (tick's PassState.covered)."""


def build_rules(
    policy: str, model: ClusterModel, prio_cfg: PriorityConfig, sched: SchedulingConfig, cap_mode: str
) -> Rules:
    """The Rules of a replay (InputError for an unknown policy or cap mode)."""
    pol = policy_named(policy)
    by_cost = pol.victims_by_cost
    hard_cap = check_cap_mode(cap_mode) == "hard"
    return Rules(
        policy=pol,
        by_cost=by_cost,
        max_preemptions=sched.max_preemptions,
        head_slack_s=sched.head_slack_s,
        ahead=sched.interactive_ahead,
        guarded=by_cost and sched.interactive_ahead == "guarded",
        harmless_first=sched.victims == "guard",
        fallback=sched.victims == "fallback",
        reserve_nodes=sched.interactive_reserve_nodes if by_cost else 0,
        reserve_arrivals=sched.interactive_reserve_arrivals,
        reserve_window_s=sched.interactive_reserve_window_s,
        hard_cap=hard_cap,
        prio_cfg=prio_cfg,
        conf=scalars(prio_cfg, model.nodes),
        cap_nodes=cap_limit(prio_cfg.interactive_cap, model.nodes),
        ubis_tiers=sched.tier_order == "ubis",
        ubis_interactive=sched.tier_order == "ubis-interactive",
    )


def checked_workload(workload: Workload, model: ClusterModel) -> Workload:
    """`workload` in submission order, or an InputError for a job the model cannot run."""
    w = workload.sorted_by_submit()
    if len(w) and int(w.nodes.max()) > model.nodes:
        big = int(np.flatnonzero(w.nodes > model.nodes)[0])
        raise InputError(f"job {int(w.job_id[big])} asks for {int(w.nodes[big])} nodes, the machine has {model.nodes}")
    if len(w) and (int(w.os.max()) >= model.os_count):
        raise InputError(f"a job asks for OS image {int(w.os.max())}, the model has {model.os_count} images")
    return w


def build_jobs(w: Workload, model: ClusterModel, share: np.ndarray) -> JobTable:
    """The JobTable of `w` (`share`: each job's user index)."""
    n = len(w)
    mem = np.where(w.memory_mb > 0, w.memory_mb, model.memory_mb_per_node).astype(np.float64)
    cols = np.empty((n, len(COLUMNS)), dtype=np.float64)
    cols[:, SUBMIT] = w.submit
    cols[:, NODES] = w.nodes
    cols[:, OS] = np.maximum(w.os, 0)
    cols[:, PREEMPT_COUNT] = 0.0
    cols[:, PREEMPTED_S] = 0.0
    cols[:, SINCE] = np.nan
    cols[:, INTERACTIVE] = w.interactive
    cols[:, SHARE] = share
    return JobTable(
        submit=w.submit.tolist(),
        need=w.nodes.astype(np.int64).tolist(),
        os=np.maximum(w.os, 0).astype(np.int64).tolist(),
        inter=w.interactive.tolist(),
        ckpt_s=(mem / model.bandwidth_mb_s).tolist(),
        mem_bytes=(mem * MIB * w.nodes).tolist(),
        remaining=w.runtime.astype(np.float64).tolist(),
        est_left=w.walltime.astype(np.float64).tolist(),
        est_a=w.walltime.astype(np.float64),
        submit_a=w.submit.astype(np.float64),
        need_a=w.nodes.astype(np.int64),
        inter_a=w.interactive.astype(bool),
        cols=cols,
        pc_a=cols[:, PREEMPT_COUNT],
        pt_a=cols[:, PREEMPTED_S],
        since_a=cols[:, SINCE],
        prev_nodes=[None] * n,
        token=[0] * n,
    )


def build_outcome(n: int) -> Outcome:
    """Nothing started yet: no start or end (nan), no overhead, no admitted wait."""
    return Outcome(
        first_start=[math.nan] * n, end=[math.nan] * n, overhead=[0.0] * n, privileged=[False] * n, fit_wait=[0.0] * n
    )


def build_cluster(model: ClusterModel) -> Cluster:
    """Every node free, the images dealt in turn (50/50 for two)."""
    node_os = np.arange(model.nodes, dtype=np.int64) % model.os_count
    return Cluster(
        node_os=node_os,
        owner=np.full(model.nodes, FREE, dtype=np.int64),
        free=model.nodes,
        free_by_os=np.bincount(node_os, minlength=model.os_count),
        free_blk=np.zeros((model.os_count, 0), dtype=np.int64),
    )


def build_queue(n: int, policy: Policy, model: ClusterModel) -> Queue:
    """An empty Queue for n jobs; rows are kept only for exact ubis (the compiled kernel
    reads them at every pass)."""
    exact_ubis = policy.exact_ubis and model.priority_refresh_s == 0
    return Queue(
        jobs=np.empty(n, dtype=np.int64),
        rows=np.empty((n if exact_ubis else 0, len(COLUMNS)), dtype=np.float64),
        fit_since=[math.nan] * n,
        prio=np.zeros(n, dtype=np.float64),
    )


def build_scratch(n: int) -> Scratch:
    """The Scratch buffers for n jobs, allocated once per replay."""
    return Scratch(
        lead_jobs=np.empty(n, dtype=np.int64),
        lead_entries=np.empty(n, dtype=np.int64),
        lead_prio=np.empty(n, dtype=np.float64),
        late=np.empty(n, dtype=np.int64),
        mark=np.zeros(n + 2, dtype=bool),
        rank=np.zeros(n, dtype=np.int64),
        vorder=np.empty(n, dtype=np.int64),
        vtier=np.empty(n, dtype=np.int64),
        vrest=np.empty(n, dtype=np.int64),
        vprio=np.zeros(n, dtype=np.float64),
    )


def build_ledger(w: Workload, cfg: PriorityConfig) -> tuple[Ledger, np.ndarray]:
    """The usage Ledger of `w`'s users, and each job's user index."""
    users, share = np.unique(np.where(w.user >= 0, w.user, -1), return_inverse=True)
    ledger = Ledger(
        usage=np.zeros(len(users)),
        usage_t=0.0,
        half_life=cfg.usage_half_life_s,
        target=user_targets(w, users, share, cfg),
        share_list=share.tolist(),
    )
    return ledger, share


def user_names(users: np.ndarray) -> list[str]:
    """The names the configuration's `[priority] targets` use for a trace's integer user ids:
    the id in decimal ("42"; "-1" for the unknown user)."""
    return [str(int(u)) for u in users]


def user_targets(w: Workload, users: np.ndarray, share: np.ndarray, cfg: PriorityConfig) -> np.ndarray:
    """Each user's target share (0..1), by the live rule (`ubis_priority.shares`): the user's
    own `[priority] targets` entry, else the user's account's `account_targets` share split
    between the account's users, else an equal part of what is left over. A user's account is
    the one of their first job in the trace (`Workload.account`, the SWF group; none when the
    trace has none); a trace gives each job one user and each user one account here, so the
    usage the simulator charges per user is the usage of that (user, account) entity.
    With no targets configured every user gets 1/n, as before targets were honoured."""
    names = user_names(users)
    account = [""] * len(names)
    if w.account is not None:
        seen = [False] * len(names)
        for k, acct in zip(share.tolist(), w.account.tolist(), strict=True):
            if not seen[k]:
                seen[k] = True
                account[k] = str(acct) if acct >= 0 else ""
    entities = list(zip(names, account, strict=True))
    shares = target_shares(entities, {}, cfg)
    return np.array([shares[e] for e in entities], dtype=np.float64)
