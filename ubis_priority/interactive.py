"""The interactive cap: how many nodes interactive jobs may hold before they lose their boost.

Why a cap: w7·I lets an interactive job preempt batch work, so a user who marks every job
interactive would take the cluster. Interactive jobs together may hold at most
`interactive_cap` of the usable nodes (default 15 %; the paper used 5 % and 15 %), and one
user at most `interactive_user_cap` when set. A job that would go beyond keeps running as an
ordinary job: its I term counts 0, it may not preempt. Whether a job is interactive at all is
the RMS's own notion (salloc/srun without a script, `qsub -I`, `oarsub -I`), set by the
adapter, never a free-form attribute the user writes.

The rule is written here once: `cap_limit` (the bound in nodes) and `within_cap` (the test).
The priority kernel, the tick decision (`preemption.scheduling.tick`), victim selection and
the simulator call them; the compiled kernel (`ubis_priority.compiled`) keeps a numba twin
of the comparison that tests/test_priority_compiled.py and tests/test_decision_differential.py
hold equal. The bound is `share × usable nodes` compared as a float, without rounding: a
5 % cap on 1,056 nodes (52.8) admits 52 nodes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from vjob.config import PriorityConfig
from vjob.model import ClusterView, Job, JobState

Request = TypeVar("Request", float, NDArray[np.float64])


def cap_limit(share: float, total_nodes: int) -> float:
    """The most nodes interactive jobs may hold under a cap of `share` (0..1) of `total_nodes`."""
    return share * float(total_nodes)


def within_cap(held: float, request: Request, limit: float) -> bool | NDArray[np.bool_]:
    """Whether `request` more nodes on top of `held` stay within `limit` (from `cap_limit`).

    Works on one request or an array of them (the kernel rates the whole queue at once): the
    same IEEE addition and comparison either way.
    """
    return held + request <= limit


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


def allowed(cfg: PriorityConfig, total_nodes: int, held: int, user_held: int, request: int) -> bool:
    """Whether an interactive job of `request` nodes may start as interactive, when interactive
    jobs hold `held` nodes and its user's hold `user_held`, on `total_nodes` usable nodes."""
    if not within_cap(float(held), float(request), cap_limit(cfg.interactive_cap, total_nodes)):
        return False
    if cfg.interactive_user_cap is None:
        return True
    return bool(within_cap(float(user_held), float(request), cap_limit(cfg.interactive_user_cap, total_nodes)))


def interactive_allowed(view: ClusterView, job: Job, cfg: PriorityConfig) -> bool:
    """Whether starting interactive `job` now keeps interactive jobs within the cap(s)."""
    usable = sum(1 for n in view.nodes if n.state.usable)
    held, per_user = held_by_interactive(view.running)
    return allowed(cfg, usable, held, per_user.get(job.user, 0), job.nodes)
