"""The interactive cap: how many nodes interactive jobs may hold before they lose their boost.

Why a cap: w7·I lets an interactive job preempt batch work, so a user who marks every job
interactive would take the cluster. Interactive jobs together may hold at most
`interactive_cap` of the usable nodes (default 15 %; the paper used 5 % and 15 %), and one
user at most `interactive_user_cap` when set. A job that would go beyond keeps running as an
ordinary job: its I term counts 0. Whether a job is interactive at all is the RMS's own notion
(salloc/srun without a script, `qsub -I`, `oarsub -I`), set by the adapter, never a free-form
attribute the user writes.
"""

from __future__ import annotations

from collections.abc import Iterable

from vjob.config import PriorityConfig
from vjob.model import ClusterView, Job, JobState


def held_by_interactive(running: Iterable[Job]) -> tuple[int, dict[str, int]]:
    """Nodes held by the interactive jobs among `running`: in total, and per user."""
    total = 0
    per_user: dict[str, int] = {}
    for job in running:
        if job.interactive and job.state is JobState.RUNNING:
            n = len(job.allocated_nodes) or job.nodes
            total += n
            per_user[job.user] = per_user.get(job.user, 0) + n
    return total, per_user


def interactive_allowed(view: ClusterView, job: Job, cfg: PriorityConfig) -> bool:
    """Whether starting interactive `job` now keeps interactive jobs within the cap(s)."""
    usable = float(sum(1 for n in view.nodes if n.state.usable))
    held, per_user = held_by_interactive(view.running)
    if float(held) + float(job.nodes) > cfg.interactive_cap * usable:
        return False
    if cfg.interactive_user_cap is None:
        return True
    return float(per_user.get(job.user, 0)) + float(job.nodes) <= cfg.interactive_user_cap * usable
