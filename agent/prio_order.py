"""`vjob prio --explain` without a job: the queue in the order the configured policy walks it,
each job's tier and its seven weighted UBIS terms.

Why through `tick.decide` and not a re-sort here: the order an operator reads must be the one
the agent acts on (and sends to the RMS as ranks); a second implementation of "tier, then
priority" would drift from it. The pass runs here with nothing checkpointable and no RMS
knob, so it only orders (no victim is looked for, nothing is sent); the jobs it would hold
as checkpointed are those the agent's observation holds (`preempted_since` set, pending or
held: agent/observe.py), and a job held by someone else is listed after the order, outside it.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from typing import Any

from preemption.scheduling.policies import TIER_NAMES
from preemption.scheduling.tick import decide
from ubis_priority.terms import TERMS
from ubis_priority.view import Priorities
from vjob.config import Config
from vjob.model import ClusterView, JobState

OUTSIDE = "held"
"""The tier shown for a held job the pass does not queue (held by its user or an admin)."""


@dataclass(frozen=True)
class Placed:
    """One queued job as the pass orders it."""

    place: int | None
    """1-based place in the policy's order; None outside it (held by someone else)."""
    job: str
    user: str
    job_class: str
    tier: str
    """`policies.TIER_NAMES` under vjob; "-" under a policy without tiers; OUTSIDE."""
    priority: float
    weighted: tuple[float, ...]
    """The seven weighted terms, in `TERMS` order; they add up to `priority`."""


def pass_order(view: ClusterView, config: Config, prios: Priorities) -> list[Placed]:
    """The pending and held jobs of `view`, in the configured policy's order, then those
    outside the pass (`prios`: `compute(view, config.priority)`, for the terms)."""
    sleeping = {
        j.id: () for j in view.pending if j.preempted_since is not None and j.state in (JobState.PENDING, JobState.HELD)
    }
    decision = decide(view, config, knob=None, checkpointable=(), sleeping=sleeping)
    t = prios.terms

    def placed(job_id: str, place: int | None) -> Placed:
        i = prios.index(job_id)
        job = prios.jobs[i]
        tier = OUTSIDE if place is None else "-"
        if job_id in decision.tiers:
            tier = TIER_NAMES[decision.tiers[job_id]]
        weighted = tuple(float(t.weighted[k, i]) for k in range(len(TERMS)))
        return Placed(place, job_id, job.user, job.job_class.value, tier, float(t.priority[i]), weighted)

    rows = [placed(job_id, k + 1) for k, job_id in enumerate(decision.order)]
    ordered = set(decision.order)
    rows += [placed(j.id, None) for j in prios.jobs if j.id not in ordered]
    return rows


WITHIN = {
    "submit": "tier, then submission time",
    "ubis": "tier, then priority",
    "ubis-interactive": "tier, then priority for interactive jobs and submission time for the others",
}
"""How the vjob policy orders inside a tier, by `[scheduling] tier_order`, as the footer says it."""


def render_order(
    rows: list[Placed],
    fmt: str,
    *,
    policy: str,
    max_priority: float,
    columns: dict[str, str],
    within: str = "submit",
) -> str:
    """`rows` as a table (`columns`: the terms' headers), JSON or CSV."""
    records: list[dict[str, Any]] = [
        {
            "place": r.place,
            "job": r.job,
            "user": r.user,
            "class": r.job_class,
            "tier": r.tier,
            **dict(zip(TERMS, r.weighted, strict=True)),
            "priority": r.priority,
        }
        for r in rows
    ]
    if fmt == "json":
        return json.dumps({"policy": policy, "max_priority": max_priority, "jobs": records}, indent=2) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=["place", "job", "user", "class", "tier", *TERMS, "priority"])
        writer.writeheader()
        writer.writerows(records)
        return buf.getvalue()
    lines = [["#", "JOBID", "USER", "TIER", *columns.values(), "PRIORITY"]]
    for r in rows:
        place = "-" if r.place is None else str(r.place)
        lines.append([place, r.job, r.user, r.tier, *(f"{w:.4f}" for w in r.weighted), f"{r.priority:.4f}"])
    widths = [max(len(line[c]) for line in lines) for c in range(len(lines[0]))]
    text = "".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() + "\n" for line in lines)
    queued = sum(r.place is not None for r in rows)
    how = WITHIN.get(within, "tier, then priority") if policy == "vjob" else "the policy's order"
    return text + f"(policy {policy}: {queued} jobs in {how}; priorities in 0..{max_priority:g})\n"
