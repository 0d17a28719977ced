"""Whether an interactive job can start beside victims that are paused but still hold memory.

Why a pure function of the view: with a pause-first checkpoint (docs/preempt-pause.md) a
victim's CPUs are free at once but its memory stays allocated until its state is on disk (the
RMS is told so: Slurm keeps a suspended job's memory in cons_tres). The interactive job then
starts at once only on nodes whose memory holds both; elsewhere it waits for the saves, and
its user is told why, like every other wait (agent.wait_notice's field). The RMS decides for
itself when the job starts; this only says what the user reads, so it must agree with the
RMS's arithmetic: memory per node, as the RMS allocated it (vjob.model.Job.memory_mb).
"""

from __future__ import annotations

from collections.abc import Sequence

from vjob.model import ClusterView


def short_of_memory(view: ClusterView, job_id: str, nodes: Sequence[str]) -> dict[str, int]:
    """Node → MiB the interactive `job_id` lacks there while every running job, the paused
    victims included, keeps its memory; only the nodes where it lacks some. Nothing for a job
    the view does not hold (a checkpoint for another reason than an interactive job's)."""
    wanted = next((j for j in view.jobs if j.id == job_id), None)
    if wanted is None:
        return {}
    need = wanted.memory_mb
    capacity = {n.name: n.memory_mb for n in view.nodes}
    used = dict.fromkeys(nodes, 0)
    for job in view.running:
        for node in job.allocated_nodes:
            if node in used:
                used[node] += job.memory_mb
    return {n: used[n] + need - capacity[n] for n in nodes if n in capacity and used[n] + need > capacity[n]}


def drain_wait_text(view: ClusterView, job_id: str, nodes: Sequence[str], victims: Sequence[str]) -> str | None:
    """What the interactive job's user reads while it waits for the victims' saves (None when
    the memory of its nodes holds it beside them: it may start at once)."""
    short = short_of_memory(view, job_id, nodes)
    if not short:
        return None
    worst = max(short, key=lambda n: (short[n], n))
    held = sum(view.job(v).memory_mb for v in victims)
    return (
        f"vjob: waits for the memory of job {', '.join(victims)} ({held} MiB) to be saved to disk "
        f"({short[worst]} MiB short on {worst}; its CPUs are free already)"
    )


__all__ = ["drain_wait_text", "short_of_memory"]
