"""UBIS priority engine: the seven-term priority equation (normalised, weighted, explainable
per factor), user usage and targets, the interactive cap, and the mapping to RMS integer
priorities.

Why two entry points: the live agent holds a ClusterView, the simulator holds columns of
numbers for tens of thousands of queued jobs. Both run equation 1 as `compute_arrays` defines
it; the simulator's scheduling passes call its compiled copy (`ubis_priority.compiled`,
numba), which tests hold to the same priorities to the last bit.

ClusterView level (live agent, `vjob prio`)::

    from ubis_priority import compute
    prios = compute(view, cfg.priority)        # view: vjob.model.ClusterView
    prios.jobs          # tuple[Job, ...]: view.pending (pending + held), in the view's order
    prios.values        # np.ndarray float64, same order, each in 0..prios.terms.max_priority
    prios.as_dict()     # {job_id: priority}
    prios.ranked()      # indices, highest priority first (ties: earlier submit, then id)
    prios.explain(id)   # Explanation: raw → normalised → weighted per term
    prios.terms         # TermArrays: raw/normalised/weighted (7, n), priority (n), capped (n)

Array level (build the columns yourself, no Job objects)::

    from ubis_priority import JobArrays, ClusterArrays, compute_arrays
    jobs = JobArrays(
        submit_time=float64[n], nodes=int64[n] (>= 1),
        os_index=int64[n] (index into free_by_os; -1 = any image),
        preempt_count=int64[n], preempted_s=float64[n] (Pt incl. an open preemption),
        interactive=bool[n], share_index=int64[n] (into target/usage),
        user_index=int64[n] (into user_interactive_held),
    )
    cluster = ClusterArrays(
        now=float, total_nodes=int (usable nodes), free_nodes=int,
        free_by_os=int64[k] (free nodes running image k),
        target=float64[e] (target share 0..1 per entity),
        usage=float64[e] (usage share 0..1 per entity: decayed node-s / everybody's),
        interactive_held=int (nodes held by running interactive jobs),
        user_interactive_held=int64[u],
    )
    terms = compute_arrays(jobs, cluster, cfg.priority)   # -> TermArrays; terms.priority

Rules written once here and used by the live decision and the simulator alike: the
interactive cap (`cap_limit`, `within_cap`, `allowed`, `interactive_allowed(view, job, cfg)`),
targets (`share_entities`, `target_shares`), usage shares (`usage_shares`, `usage_total`) and
usage decay (`decay_factor`, `decayed`). Also `slurm_site_factor` / `pbs_priority` (integer
mapping), and `ubis_priority.usage` (decayed node-seconds kept in the
state store: `charge`, `load_usage`, `load_targets`, `sync_targets`, `with_history`).
"""

from ubis_priority.decay import decay_factor, decayed
from ubis_priority.integers import integer_priority, pbs_priority, slurm_site_factor
from ubis_priority.interactive import allowed, cap_limit, interactive_allowed, within_cap
from ubis_priority.kernel import ClusterArrays, JobArrays, TermArrays, compute_arrays
from ubis_priority.shares import share_entities, target_shares, usage_shares, usage_total
from ubis_priority.terms import SCALES, TERMS
from ubis_priority.view import Explanation, Priorities, TermExplanation, arrays_from_view, compute

__all__ = [
    "SCALES",
    "TERMS",
    "ClusterArrays",
    "Explanation",
    "JobArrays",
    "Priorities",
    "TermArrays",
    "TermExplanation",
    "allowed",
    "arrays_from_view",
    "cap_limit",
    "compute",
    "compute_arrays",
    "decay_factor",
    "decayed",
    "integer_priority",
    "interactive_allowed",
    "pbs_priority",
    "share_entities",
    "slurm_site_factor",
    "target_shares",
    "usage_shares",
    "usage_total",
    "within_cap",
]
