"""The scheduling decision: one pass of a policy over a ClusterView, pure.

This is the one scheduling pass of vjob. The live agent runs it at every tick
(agent/loop.py); the simulator runs the same pass with compiled hot paths
(simulator/engine_pass.py `_schedule`, engine_preempt.py `_preempt_for`), and tests/test_decision_differential.py
holds the two equal on random cluster states: same jobs started, same victims, same nodes,
the same priorities to the last bit. `policy` picks the queue order and what an interactive
job may do (`policies.py`): `vjob` (the default, `[scheduling] policy`; docs/policy.md),
`ubis`, `mms`, `mms-block`, `fcfs-easy`.

One pass, as the UBIS paper schedules:

* the queue (pending jobs, and the jobs vjob checkpointed and holds) in the policy's order;
* in that order, a job that fits the free nodes starts; an interactive job within the
  interactive cap (`ubis_priority.interactive`) that does not fit checkpoints the
  lowest-priority batch jobs (`victims.choose_victims`) and starts once their checkpoints are
  written (ubis; under vjob the cheapest victims, and only while the first batch job's
  reservation holds, `guard.keeps_reservation`); the first job that can do neither is the head and gets the EASY
  reservation, and later jobs that do not delay it are backfilled (`easy.py`);
* each start takes its nodes (`nodes.py`) before the next job is looked at, so one pass never
  counts the same node twice; a victim's nodes the interactive job does not take stay busy
  until its checkpoint is written.

What the agent does with the answer: it writes the pass's order onto the RMS's integer knob,
carries out the preemptions (only vjobs whose pilot runs their VM, `checkpointable`, can be
victims), and releases the held jobs the pass starts, onto their saved nodes when all are
free (a local resume). Pending jobs the pass starts are the RMS's to start (`starts` says
which the pass expects). What still differs between live and simulated is listed in
docs/simulator.md ("Live and simulated").
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np

from preemption.scheduling.easy import backfill, reservation
from preemption.scheduling.lazy_map import LazyMap
from preemption.scheduling.pass_state import Costs, PassState
from preemption.scheduling.policies import (
    Order,
    Policy,
    check_cap_mode,
    fcfs_order,
    mms_order,
    policy_named,
    ubis_order,
    vjob_order,
    vjob_tiers,
)
from preemption.scheduling.reserve import need_beside
from preemption.scheduling.running_base import estimate
from preemption.scheduling.site_order import SiteOrder, band_values, ubis_fractions, walk_order, walk_positions
from preemption.scheduling.waiting import WaitReason
from ubis_priority import compute, integer_priority, job_columns
from ubis_priority.job_columns import HELD, PENDING
from vjob.config import Config
from vjob.model import ClusterView, Job
from vjob.rms import PriorityKnob

_job_id = attrgetter("id")


@dataclass(frozen=True)
class Preemption:
    """Checkpoint `victims` so that interactive `job_id` can start on `nodes`."""

    job_id: str
    victims: tuple[str, ...]
    nodes: tuple[str, ...]
    checkpoint_bytes: float


@dataclass(frozen=True)
class Release:
    """Let a checkpointed vjob run again, preferably on the nodes it was saved on."""

    job_id: str
    preferred_nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Decision:
    priorities: Mapping[str, float] = field(default_factory=dict)
    """UBIS priority of every pending or held job."""
    rms_priorities: Mapping[str, int] = field(default_factory=dict)
    """For the RMS's integer knob (Slurm site factor, PBS priority): the pass's queue order
    (`order`), first job highest (`_rank_priorities`); under vjob with a knob `share` below 1
    and the site's own priorities read, the tiers in bands and vjob's share of each tier
    (`_site_priorities`, site_order.py); empty when the RMS has none (OAR)."""
    preemptions: tuple[Preemption, ...] = ()
    releases: tuple[Release, ...] = ()
    waiting_interactive: tuple[str, ...] = ()
    """Interactive jobs the pass does not start (cap reached, no victims, behind the head)."""
    waits: Mapping[str, WaitReason] = field(default_factory=dict)
    """Why each of `waiting_interactive` waits (waiting.py): what the agent tells its user."""
    starts: tuple[str, ...] = ()
    """Every job the pass starts, in order: fitting, by preemption, backfilled."""
    reserved: str | None = None
    """The head of the queue: the job holding the EASY reservation, if any."""
    placements: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """The nodes the pass gives each job it starts (the node choice of `nodes.py`)."""
    anchors: Mapping[str, float] = field(default_factory=dict)
    """vjob: the queued jobs' guarded reserved starts, to pass to the next tick's `decide`."""
    order: tuple[str, ...] = ()
    """The queue (pending and held jobs) in the policy's order, the one the pass walks and
    `rms_priorities` follows."""
    exact_priorities: bool = False
    """`rms_priorities` are tier bands the RMS adds to its own priority (`_site_priorities`):
    it must hold these very values, not only their order, for the pass's walk to be its order
    (the agent then sends every changed value, agent.site_read.resync)."""
    tiers: Mapping[str, int] = field(default_factory=dict)
    """vjob: each queued job's tier (`policies.TIER_NAMES`: 0 interactive within the cap,
    1 checkpointed, 2 interactive ahead of batch, 3 the rest); empty under other policies."""


def decide(
    view: ClusterView,
    cfg: Config,
    *,
    knob: PriorityKnob | None,
    checkpointable: Collection[str] | None,
    sleeping: Mapping[str, tuple[str, ...]],
    policy: str | None = None,
    costs: Costs | None = None,
    backfill_depth: int | None = None,
    bill_victims: bool = False,
    cap_mode: str = "preempt",
    anchors: Mapping[str, float] | None = None,
    site: SiteOrder | None = None,
) -> Decision:
    """One scheduling pass of `policy` over `view` (see the module docstring).

    `knob`: the RMS's integer priority range (the adapter's `abilities.priority`), None when the
    RMS has none. `checkpointable`: ids of running vjobs that may be checkpointed (their pilot
    runs their VM); None = every running batch job, including those the pass starts (the
    simulator's model). `sleeping`: ids of the jobs vjob checkpointed and holds, with the nodes
    they were saved on; only those of the held jobs are in the queue. `backfill_depth`: how many
    jobs after the head EASY looks at (None: all). `bill_victims`: add a victim's run so far to
    its user's usage when it is checkpointed, so that later victim choices of the same pass see
    it — the simulator's accounting, which charges a run when it ends or is checkpointed; live,
    the agent charges every running job before each tick, so the view's usage already holds it.
    `policy`: None = `cfg.scheduling.policy`. `cap_mode`: "preempt" (an interactive job beyond
    the cap runs as an ordinary job) or "hard" (it does not start until within the cap, and
    interactive jobs are not backfilled; policies.py). `anchors`: vjob, the reserved starts
    guarded jobs had when first protected (`Decision.anchors` of the previous tick), so that
    the slack bounds the whole delay of the queue's first batch job, not each tick's.
    `site`: the RMS's own priority of the queued jobs (Slurm's multifactor without vjob's
    site factor); with a knob whose `share` is below 1, vjob sends its tiers in bands and its
    share of each tier, and walks each tier in the order the RMS will follow (site_order.py).
    """
    pol = policy_named(cfg.scheduling.policy if policy is None else policy)
    hard = check_cap_mode(cap_mode) == "hard"
    prios = compute(view, cfg.priority)
    pending_ids = list(map(_job_id, prios.jobs))
    pending_prio = LazyMap(pending_ids, prios.values)  # a dict when read: the tick does not

    state = PassState(view, cfg, costs or Costs(), checkpointable, sleeping, bill_victims, pol)
    state.anchors.update(anchors or {})
    cols = job_columns.columns(view.jobs)  # the jobs' values, as `compute` read them
    rows = _queue_rows(cols, sleeping)
    # the queue's UBIS priorities: `compute` rated the pending and held jobs, in the view's order
    rated = _pending_rows(cols)
    every = rows.shape[0] == rated.shape[0]  # the queue is all of them (no job held by others)
    queue = prios.jobs if every else cols.pick(rows)
    at = np.searchsorted(rated, rows)  # each queued job's place among them
    ids = pending_ids if every else None
    ordered, tiers, walk = _order(pol, queue, prios.values[at], state, cols, rows, at, ids)
    exact = knob is not None and knob.share < 1.0 and site is not None and walk is not None
    if exact:
        top = prios.terms.max_priority
        ordered, rms_prio = _site_priorities(
            ordered, tiers, pending_prio, top, knob, site, state, walk=walk, pending_ids=pending_ids
        )
    else:
        rms_prio = {} if knob is None else _rank_priorities(ordered, pending_ids, knob)
    started, preemptions, head, head_at, head_priv = _walk(ordered, state, pol, hard)
    if head is not None and state.free_count() > 0 and not (pol.blocks_behind_interactive and head_priv):
        started += _backfill(view.now, head, head_priv, ordered[head_at + 1 :], state, backfill_depth, hard)

    done = set(started)
    asked = cols.state[rows]
    waiting = [j for j in cols.pick(rows[cols.interactive[rows] & (asked == PENDING)]) if j.id not in done]
    held = set(map(_job_id, cols.pick(rows[asked == HELD])))
    releases = tuple(
        Release(job_id, state.resumed_on.get(job_id, ())) for job_id in started if job_id in sleeping and job_id in held
    )
    return Decision(
        priorities=pending_prio,
        rms_priorities=rms_prio,
        preemptions=tuple(preemptions),
        releases=releases,
        waiting_interactive=tuple(j.id for j in waiting),
        waits=state.wait_reasons(waiting, head),
        starts=tuple(started),
        reserved=None if head is None else head.id,
        placements={job_id: state.jobs[job_id].allocated_nodes for job_id in started},
        anchors=_still_queued(state.anchors, pending_ids, done),
        order=tuple(map(_job_id, ordered)),
        exact_priorities=exact,
        tiers=tiers,
    )


def _pending_rows(cols: job_columns.ViewColumns) -> np.ndarray:
    """The rows `compute` rates (ubis_priority.view.arrays_from_view): pending and held jobs."""
    return np.flatnonzero((cols.state == PENDING) | (cols.state == HELD))


def _still_queued(anchors: Mapping[str, float], pending_ids: list[str], done: set[str]) -> dict[str, float]:
    """The anchors of jobs still pending and not started (a few: looked up in the list
    rather than making a set of 100,000 ids)."""
    keep = [k for k in anchors if k not in done]
    if len(keep) > 8:
        queued = set(pending_ids)
        return {k: v for k, v in anchors.items() if k in queued and k not in done}
    keep = {k for k in keep if k in pending_ids}
    return {k: v for k, v in anchors.items() if k in keep}


def _walk(
    ordered: Sequence[Job], state: PassState, pol: Policy, hard: bool
) -> tuple[list[str], list[Preemption], Job | None, int, bool]:
    """The queue in order until the head: each job that fits starts, an interactive job
    within the cap that does not fit preempts (when the policy lets it), and the first job
    that can do neither is the head. Returns (started, preemptions, head, its position in
    `ordered`, whether it is a privileged interactive job)."""
    started: list[str] = []
    preemptions: list[Preemption] = []
    for at, job in enumerate(ordered):
        priv = job.interactive and state.within_caps(job)
        if hard and job.interactive and not priv:
            continue  # beyond the cap: it waits, and is not the head either
        if state.guarded and job.interactive and not priv:  # vjob: beyond the cap, never the head
            if state.fits_beside(job) and (state.guard is None or state.keeps_guard(job, (), job.nodes)):
                state.start(job, False)
                started.append(job.id)
            continue
        if (job.nodes <= state.free_count()) if priv else state.fits_beside(job):
            state.start(job, priv)
            started.append(job.id)
            continue
        if priv and pol.preempts:
            pre = state.preempt_for(job)
            if pre is not None:
                preemptions.append(Preemption(job.id, *pre))
                started.append(job.id)
                continue
        return started, preemptions, job, at, priv
    return started, preemptions, None, 0, False


def _backfill(
    now: float,
    head: Job,
    head_priv: bool,
    rest: Sequence[Job],
    state: PassState,
    backfill_depth: int | None,
    hard: bool,
) -> list[str]:
    """The jobs after the head (`rest`) EASY starts without delaying the head's reservation
    (the reserve for interactive arrivals kept free beside it), started on the pass's state."""
    free = state.free_count()
    kept = state.reserve()
    need = head.nodes if head_priv else need_beside(head.nodes, kept, len(state.node_order))
    shadow, extra = reservation(now, free, need, state.holds.values())
    if state.by_cost and state.interactive_ahead == "backfill":  # interactive jobs looked at first
        rest = [j for j in rest if j.interactive] + [j for j in rest if not j.interactive]
    if backfill_depth is not None:
        rest = rest[:backfill_depth]
    if hard:
        rest = [j for j in rest if not j.interactive]
    late = backfill(
        now,
        max(0, free - kept),
        shadow,
        extra,
        range(len(rest)),
        [j.nodes for j in rest],
        [estimate(j) for j in rest],
    )
    started: list[str] = []
    for i in late:
        job = rest[i]
        state.start(job, job.interactive and state.within_caps(job))
        started.append(job.id)
    return started


def _queue_rows(cols: job_columns.ViewColumns, sleeping: Mapping[str, tuple[str, ...]]) -> np.ndarray:
    """The rows of the queue in the view: pending jobs, and the held ones vjob holds."""
    mask = cols.state == PENDING
    held = np.flatnonzero(cols.state == HELD)
    if held.shape[0]:
        ours = np.fromiter((j.id in sleeping for j in cols.pick(held)), dtype=np.bool_, count=held.shape[0])
        mask[held[ours]] = True
    return np.flatnonzero(mask)


def _order(
    policy: Policy,
    queue: Sequence[Job],
    prio: np.ndarray,
    state: PassState,
    cols: job_columns.ViewColumns,
    rows: np.ndarray,
    pending_at: np.ndarray | None = None,
    queue_ids: list[str] | None = None,
) -> tuple[list[Job], Mapping[str, int], QueueArrays | None]:
    """The queue in `policy`'s order (equal keys keep the view's order), and under vjob each
    job's tier (`policies.vjob_tiers`) and the ordered queue's arrays (`QueueArrays`).
    `queue` is `cols`' jobs at `rows`, whose columns give the submission times, classes and
    preemption counts; `prio` their UBIS priorities, in that order; `pending_at` their places
    among the jobs `compute` rated (handed on in `QueueArrays.pending_at`); `queue_ids` the
    queue's ids when the caller has them."""
    if not queue:
        return [], {}, None
    submit = cols.submit_time[rows]
    tier_of: Mapping[str, int] = {}
    walk: QueueArrays | None = None
    if policy.order is Order.SUBMIT:
        order = fcfs_order(submit)
    elif policy.order is Order.PRIVILEGED_FIRST:
        order = mms_order(submit, _privileged(queue, cols.interactive[rows], state))
    elif policy.order is Order.TIERS:
        inter = cols.interactive[rows]
        privileged = _privileged(queue, inter, state)
        ahead = inter if state.interactive_ahead in ("queue", "guarded") else None
        resumed = cols.preempt_count[rows] > 0
        if state.ubis_tiers:
            rated = prio
        elif state.ubis_interactive:
            rated = np.zeros(len(queue), dtype=np.float64)
            for k in np.flatnonzero(privileged).tolist():
                rated[k] = prio[k]
        else:
            rated = np.zeros(len(queue), dtype=np.float64)  # `tier_order = "submit"`: ranked by nothing
        ids = list(map(_job_id, queue)) if queue_ids is None else queue_ids
        keys = cols.id_key[rows]  # plain numbers: ranked as `id_ranks` ranks them
        ties = keys if keys.shape[0] and int(keys.min()) >= 0 else id_ranks(queue, ids)
        order = vjob_order(submit, privileged, resumed, ahead, rated, ties)
        tiers = vjob_tiers(privileged, resumed, ahead)
        tier_of = LazyMap(ids, tiers)  # a dict when read: the tick does not
        # the guard: the first batch job in the order, whose reservation preemptions keep
        batch = order[~inter[order]]
        state.guard = queue[int(batch[0])] if batch.shape[0] else None
        at = order.tolist()
        placed = None if pending_at is None else pending_at[order]
        walk = QueueArrays(list(map(ids.__getitem__, at)), tiers[order], rated[order], placed)
        return list(map(queue.__getitem__, at)), tier_of, walk
    else:
        order = ubis_order(prio.tolist(), submit)
    return [queue[i] for i in order.tolist()], tier_of, walk


@dataclass(frozen=True)
class QueueArrays:
    """The ordered queue's ids, tiers and UBIS priorities as `_order` rated them (0 for the
    jobs the tier order does not rate), in that order: what `_site_priorities` reads, handed
    on rather than looked up again per job in dicts (three look-ups per job were 7 % of the
    agent's tick at 100,000 queued jobs)."""

    ids: list[str]
    tier: np.ndarray
    rated: np.ndarray
    pending_at: np.ndarray | None = None
    """Each job's place among the pending and held jobs (`decide`'s `pending_ids`)."""


def _privileged(queue: Sequence[Job], interactive: np.ndarray, state: PassState) -> np.ndarray:
    """Which jobs of `queue` are interactive and within the caps (asked of the interactive
    ones only, in the queue's order)."""
    out = np.zeros(len(queue), dtype=np.bool_)
    for k in np.flatnonzero(interactive).tolist():
        out[k] = state.within_caps(queue[k])
    return out


def id_ranks(jobs: Sequence[Job], ids: list[str] | None = None) -> np.ndarray:
    """Each job's place when the ids are sorted shortest first, then as text: numeric ids
    ("99" < "100", "7_2" < "7_10", "9.server" < "10.server") in their numeric order, so a
    tie of priority and submission time goes to the earlier job, as in the simulator (its
    job index). In NumPy (a Python sort keyed per job cost a tenth of a second at 100,000
    jobs): ids of equal length compare as Python compares them. `ids`: the jobs' ids, when
    the caller has them already."""
    if ids is None:
        ids = [j.id for j in jobs]
    if not ids:
        return np.zeros(0, dtype=np.int64)
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    by_id = np.lexsort((np.array(ids), lengths))
    ranks = np.empty(len(ids), dtype=np.int64)
    ranks[by_id] = np.arange(len(ids), dtype=np.int64)
    return ranks


def _site_priorities(
    ordered: Sequence[Job],
    tiers: Mapping[str, int],
    pending: Mapping[str, float],
    max_priority: float,
    knob: PriorityKnob,
    site: SiteOrder,
    state: PassState,
    walk: QueueArrays | None = None,
    pending_ids: Sequence[str] | None = None,
) -> tuple[list[Job], dict[str, int]]:
    """vjob's tiers in bands and its share of each tier on the knob, the site's own priority
    the rest (site_order.py); the queue re-walked in the order the RMS will then follow, and
    the guard (the first batch job) taken from that order, so that the job it protects is
    the one the RMS starts first. Pending jobs outside the queue get the lowest value.
    `walk`: `ordered`'s ids, tiers and rated priorities from `_order` (else read from
    `tiers` and `pending`, the same values). `pending_ids`: `pending`'s keys, in its order."""
    # in arrays, over the queue once (site_order.py): at a site's size 100,000 jobs, where the
    # per-job dicts and sums cost the agent a third of a second a tick
    rated = "all" if state.ubis_tiers else "interactive" if state.ubis_interactive else "none"  # none: "submit"
    if walk is None:
        ids = [j.id for j in ordered]
        tier = np.fromiter(map(tiers.__getitem__, ids), dtype=np.int64, count=len(ids))
        frac = ubis_fractions(ids, tier, pending, max_priority, rated)
    else:
        ids, tier = walk.ids, walk.tier
        frac = walk.rated / max_priority if rated != "none" and max_priority > 0 else np.zeros(len(ids))
    values = band_values(tier, frac, knob, site.span)
    sent = values.tolist()
    positions = walk_positions(values, ids, site.own)
    if positions is None:  # a priority beyond 2**52: the exact sums of Python ints
        walked = walk_order(ordered, dict(zip(ids, sent, strict=True)), site.own)
    else:
        walked = list(map(ordered.__getitem__, positions.tolist()))
    state.guard = next((j for j in walked if not j.interactive), None)
    if walk is not None and walk.pending_at is not None and pending_ids is not None:
        # one dict, as the two lines below make it: every pending job the lowest value, in
        # their order, then the queue's values (100,000 entries: 15-25 ms a dict made)
        every = np.full(len(pending_ids), knob.low, dtype=np.int64)
        every[walk.pending_at] = values
        return walked, dict(zip(pending_ids, every.tolist(), strict=True))
    out = dict.fromkeys(pending if pending_ids is None else pending_ids, knob.low)
    out.update(zip(ids, sent, strict=True))
    return walked, out


def _rank_priorities(ordered: Sequence[Job], pending: Iterable[str], knob: PriorityKnob) -> dict[str, int]:
    """The pass's order as the RMS's integer priorities, the first job highest, evenly spread
    over the knob, under every policy: the RMS starts the pending jobs itself, in the order of
    its knob. With the UBIS priorities on it Slurm served a small batch job before the large
    job vjob's order kept at the head (tests/test_policy_live_order.py), `mms` and
    `fcfs-easy` (submission order) were ranked by UBIS's terms instead, and under `ubis` two
    priorities rounded to one integer let the RMS break the tie by submission, not as the
    pass did (tests/test_policy_rms_order.py). Pending jobs outside the queue (held by
    someone else) get the lowest value. Beyond high - low + 1 queued jobs neighbours share a
    value and the RMS breaks those ties itself."""
    n = len(ordered)
    ints = integer_priority(np.arange(n, 0, -1, dtype=np.float64) / max(n, 1), 1.0, knob.low, knob.high)
    out = dict.fromkeys(pending, knob.low)
    out.update({job.id: int(v) for job, v in zip(ordered, ints, strict=True)})
    return out
