"""A job's state change put into its kept Job from its listing Row, without reading its JSON.

Why: on Slurm 20.11-22.05 `squeue --json` ignores every filter, so reading the JSON of even one
changed job streams the whole listing (805 MB at a site's size, ~0.5 s of the agent's CPU).
At steady state most changed jobs only changed state (started, suspended, resumed, held,
released), and everything such a change moves in a Job is in the listing line Slurm prints
from the same job record: the state word, the start time (POSIX seconds: the listing runs with
SLURM_TIME_FORMAT=%s), the allocated nodes and the priority (0: held). So the Job is built as
plugins.slurm.parse_json._job builds it from the JSON, with those fields from the Row and the
rest kept from the last JSON read.

Only when that is certain: the Row must equal the Row of the last read in node and CPU counts,
memory, time limit and submit time (a requeue moves the submit time on 22.05: read as JSON),
the kept Job must agree with the Row's counts and submit time (squeue computes a pending job's
node count its own way), the memory must be asked for (0: the JSON's TRES, which an allocation
changes, decides it) and the start time must be a number. Anything else returns None: the job's
JSON is read as before. No text a user writes (name, comment, account) comes from the listing.
"""

from __future__ import annotations

import dataclasses

from plugins.slurm import hostlist
from plugins.slurm.states import job_state
from vjob.errors import InputError
from vjob.model import Job, JobState

STATE, NODES, CPUS, MEMORY, LIMIT, SUBMIT, START, ALLOC, HELD = range(9)
"""The places of a Row (plugins.slurm.incremental.Row)."""

CHECKED = ("state", "start_time", "allocated_nodes", "nodes", "cores", "memory_mb", "walltime", "submit_time")
"""The fields of a Job applied from a Row or vouched for by it: compared with the JSON at a resync."""


def applied(kept: Job, before: tuple[str, ...], now: tuple[str, ...], *, where: str = "squeue listing") -> Job | None:
    """`kept` (read from JSON when its job's Row was `before`) with the state change of Row
    `now` put in; None when the change is more than a state change or not certain."""
    if before[NODES:START] != now[NODES:START] or not _numbers_agree(kept, now):
        return None
    try:
        state = job_state(now[STATE], where=where)
    except InputError:
        return None
    if kept.state is JobState.HELD and before[HELD] != "held":
        return None  # held by what the listing does not show (its reason): only the JSON says
    if state is JobState.PENDING and now[HELD] == "held":
        state = JobState.HELD  # as parse_json: a pending job of priority 0 is held
    if state.finished:
        return None
    start_time: float | None = None
    nodes: tuple[str, ...] = ()
    if state in (JobState.RUNNING, JobState.SUSPENDED):
        start = now[START]
        if not (start.isascii() and start.isdigit() and len(start) <= 12):
            return None  # not POSIX seconds (SLURM_TIME_FORMAT not honoured): never guess a zone
        start_time = float(start) if int(start) > 0 else None
        try:
            nodes = hostlist.expand(now[ALLOC], f"{where}: job {kept.id} nodes")
        except InputError:
            return None
    if (state, start_time, nodes) == (kept.state, kept.start_time, kept.allocated_nodes):
        return kept
    return dataclasses.replace(kept, state=state, start_time=start_time, allocated_nodes=nodes)


def _numbers_agree(kept: Job, row: tuple[str, ...]) -> bool:
    """Whether the kept Job's counts and submit time are what the Row says, and its memory was
    asked for (not taken from the allocation's TRES)."""
    count, cpus, submit = row[NODES], row[CPUS], row[SUBMIT]
    if not (count.isascii() and count.isdigit() and cpus.isascii() and cpus.isdigit()):
        return False
    if not (submit.isascii() and submit.isdigit() and len(submit) <= 12):
        return False
    node_count, cpu_count = int(count) or 1, int(cpus) or 1
    if kept.nodes != node_count or kept.cores != -(-cpu_count // node_count):
        return False
    if kept.submit_time != (float(submit) if int(submit) > 0 else 0.0):
        return False
    memory = row[MEMORY].rstrip("KMGTPkmgtp")
    return memory.replace(".", "", 1).isdigit() and float(memory) > 0


def drift(applied_job: Job, read: Job) -> list[str]:
    """The CHECKED fields in which a Job applied from its Row differs from its JSON read."""
    return [name for name in CHECKED if getattr(applied_job, name) != getattr(read, name)]


__all__ = ["CHECKED", "applied", "drift"]
