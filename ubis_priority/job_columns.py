"""What the priority kernel and the scheduling pass read of each job, kept from call to call
for the Job objects that are the same objects.

Why: at a site's size (100,000 pending and 20,000 running jobs) reading a dozen attributes
of every Job at every tick, one Python comprehension per column, was nearly all of
`ubis_priority.compute` (0.12 s of its 0.13 s; the kernel on the arrays 0.003 s) and a good
part of the pass's queue order. Between two ticks few jobs change, and the agent's Slurm
adapter gives an unchanged job back as the same object (plugins/slurm/incremental.py); a Job
is frozen, so what was read of an object once holds for as long as it lives. The values are
kept here in NumPy columns, one row per Job object met, found again by the object's
identity: a call costs one dictionary look-up per job (done in C) and gathers.

Identity is only safe while the object lives: the table keeps a reference to every object it
has a row for, so that no other object can take its `id()`, and it is rebuilt from the jobs
of the current call once it holds a quarter more rows than theirs (old jobs let go: at 60
changed jobs a tick, every 500 ticks or so at a site's size).

Same values as reading the objects, to the bit: the columns hold what `np.array` would make
of the attributes (tests/test_job_columns.py compares on changing views, and the decisions
are held by tests/test_decision_bulk.py and tests/test_decision_differential.py).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter

import numpy as np

from vjob.model import Job, JobClass, JobState

STATES: tuple[JobState, ...] = tuple(JobState)
"""A job's state as a small integer: its place here."""
STATE_CODE: dict[JobState, int] = {s: k for k, s in enumerate(STATES)}
PENDING = STATE_CODE[JobState.PENDING]
HELD = STATE_CODE[JobState.HELD]
RUNNING = STATE_CODE[JobState.RUNNING]


class Strings:
    """Strings (or pairs of them) numbered in the order they are met: a code per value."""

    def __init__(self) -> None:
        self.code: dict[object, int] = {}
        self.values: list[object] = []

    def __call__(self, value: object) -> int:
        code = self.code.get(value)
        if code is None:
            code = self.code[value] = len(self.values)
            self.values.append(value)
        return code

    def present(self, codes: np.ndarray) -> list[object]:
        """The values whose codes appear in `codes`, in code order (counted, not sorted:
        `np.unique` of 120,000 codes cost several ms a call, at every tick)."""
        if codes.shape[0] == 0:
            return []
        return [self.values[c] for c in np.flatnonzero(np.bincount(codes)).tolist()]

    def positions(self, ordered: Sequence[object]) -> np.ndarray:
        """Code → the value's position in `ordered` (-1 where it is not in it; a value there
        twice: its last place). The look-ups in C: the share entities are 8,000 at a site's
        size, at every tick."""
        out = np.full(len(self.values) + 1, -1, dtype=np.int64)
        codes = np.fromiter(map(self.code.get, ordered, repeat(-1)), dtype=np.int64, count=len(ordered))
        known = np.flatnonzero(codes >= 0)
        if np.unique(codes[known]).shape[0] == known.shape[0]:  # each once: no place overwritten
            out[codes[known]] = known
            return out
        for k, value in enumerate(ordered):
            code = self.code.get(value)
            if code is not None:
                out[code] = k
        return out


@dataclass(frozen=True)
class ViewColumns:
    """The columns of one tuple of jobs, in its order (row k: `jobs[k]`)."""

    jobs: tuple[Job, ...]
    state: np.ndarray
    submit_time: np.ndarray
    nodes: np.ndarray
    preempt_count: np.ndarray
    preempted_seconds: np.ndarray
    preempted_since: np.ndarray
    """NaN where the job has no preemption running (`preempted_since` None)."""
    interactive: np.ndarray
    os_code: np.ndarray
    user_code: np.ndarray
    share_code: np.ndarray
    """The (user, account) pair's code."""
    id_key: np.ndarray
    """The job id as a number where it is one in plain decimals (`id_key`), else -1."""
    table: JobColumns

    def pick(self, rows: np.ndarray) -> tuple[Job, ...]:
        """The jobs at `rows`, as a tuple (gathered in C)."""
        return pick(self.jobs, rows)


def pick(jobs: Sequence[Job], rows: np.ndarray) -> tuple[Job, ...]:
    """`tuple(jobs[k] for k in rows)`, gathered in C."""
    if rows.shape[0] == 0:
        return ()
    if rows.shape[0] == 1:
        return (jobs[int(rows[0])],)
    return itemgetter(*rows.tolist())(jobs)


class JobColumns:
    """The table: one row per Job object met (see the module docstring)."""

    _FLOAT = ("submit_time", "preempted_seconds", "preempted_since")
    _INT = ("state", "nodes", "preempt_count", "os_code", "user_code", "share_code", "id_key")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        """One caller at a time: the table and its last answer change as it answers."""
        self._row: dict[int, int] = {}
        self._kept: list[Job] = []
        """Row → its Job object, held so that its `id()` stays its own."""
        self.images = Strings()
        self.users = Strings()
        self.shares = Strings()
        self._cols: dict[str, np.ndarray] = {}
        self._reset_columns(0)
        self._last: ViewColumns | None = None
        self.memo: dict[str, tuple[object, object]] = {}
        """What a caller derived from these columns, under its name: (the inputs, the answer),
        answered again while the inputs compare equal (ubis_priority.view's share entities)."""

    def _reset_columns(self, capacity: int) -> None:
        self._cols = {name: np.zeros(capacity, dtype=np.float64) for name in self._FLOAT}
        self._cols.update({name: np.zeros(capacity, dtype=np.int64) for name in self._INT})
        self._cols["interactive"] = np.zeros(capacity, dtype=np.bool_)

    def __len__(self) -> int:
        return len(self._kept)

    def of(self, jobs: tuple[Job, ...]) -> ViewColumns:
        """The columns of `jobs` (the last answer again when `jobs` is the same tuple)."""
        with self.lock:
            last = self._last
            if last is not None and last.jobs is jobs:
                return last
            if len(self._kept) > len(jobs) + len(jobs) // 4 + 1024:  # old objects: let go
                self._drop_all()
            rows = self._rows(jobs)
            c = self._cols
            out = ViewColumns(
                jobs=jobs,
                state=c["state"][rows],
                submit_time=c["submit_time"][rows],
                nodes=c["nodes"][rows],
                preempt_count=c["preempt_count"][rows],
                preempted_seconds=c["preempted_seconds"][rows],
                preempted_since=c["preempted_since"][rows],
                interactive=c["interactive"][rows],
                os_code=c["os_code"][rows],
                user_code=c["user_code"][rows],
                share_code=c["share_code"][rows],
                id_key=c["id_key"][rows],
                table=self,
            )
            self._last = out
            return out

    def _drop_all(self) -> None:
        """Forget every row (the jobs of this call are read again): the objects of views gone
        by are let go. Strings keep their codes (a handful of users and images)."""
        self._row = {}
        self._kept = []
        self._reset_columns(0)

    def _rows(self, jobs: tuple[Job, ...]) -> np.ndarray:
        """Each job's row, new objects read and added first."""
        get = self._row.get
        rows = np.fromiter(map(get, map(id, jobs), [-1] * len(jobs)), dtype=np.int64, count=len(jobs))
        new = np.flatnonzero(rows < 0)
        if new.shape[0]:
            fresh = [jobs[k] for k in new.tolist()]
            once: dict[int, Job] = {}
            for job in fresh:  # the same object twice in one tuple: one row
                once.setdefault(id(job), job)
            first = len(self._kept)
            at = {key: first + k for k, key in enumerate(once)}
            self._add(list(once.values()))
            rows[new] = [at[id(job)] for job in fresh]
        return rows

    def _add(self, jobs: list[Job]) -> None:
        """Rows for `jobs` (new objects, each once), at the end of the table."""
        start = len(self._kept)
        end = start + len(jobs)
        cap = self._cols["state"].shape[0]
        if end > cap:
            size = max(end, 2 * cap, 1024)
            for name, col in list(self._cols.items()):
                grown = np.zeros(size, dtype=col.dtype)
                grown[:start] = col[:start]
                self._cols[name] = grown
        c = self._cols
        interactive = JobClass.INTERACTIVE
        c["state"][start:end] = [STATE_CODE[j.state] for j in jobs]
        c["submit_time"][start:end] = np.array([j.submit_time for j in jobs], dtype=np.float64)
        c["nodes"][start:end] = np.array([j.nodes for j in jobs], dtype=np.int64)
        c["preempt_count"][start:end] = np.array([j.preempt_count for j in jobs], dtype=np.int64)
        c["preempted_seconds"][start:end] = np.array([j.preempted_seconds for j in jobs], dtype=np.float64)
        c["preempted_since"][start:end] = np.array(
            [np.nan if j.preempted_since is None else j.preempted_since for j in jobs], dtype=np.float64
        )
        c["interactive"][start:end] = [j.job_class is interactive for j in jobs]
        c["os_code"][start:end] = [self.images(j.os_image) for j in jobs]
        c["user_code"][start:end] = [self.users(j.user) for j in jobs]
        c["share_code"][start:end] = [self.shares((j.user, j.account)) for j in jobs]
        c["id_key"][start:end] = [id_key(j.id) for j in jobs]
        for k, job in enumerate(jobs, start):
            self._row[id(job)] = k
        self._kept.extend(jobs)


def id_key(job_id: str) -> int:
    """`job_id` as a number when it is plain decimal digits without a leading zero, at most
    18 of them ("0", "7", "12345"), else -1. Such ids sort shortest first then as text —
    the pass's tie-break (`tick.id_ranks`) — exactly as their numbers do, so a queue of them
    is ranked by this column instead of sorting its ids as text at every tick."""
    if job_id.isascii() and job_id.isdigit() and len(job_id) <= 18 and (job_id[0] != "0" or job_id == "0"):
        return int(job_id)
    return -1


TABLE = JobColumns()
"""The process's table (the agent's ticks, `vjob prio`, the tests' views)."""


def columns(jobs: tuple[Job, ...]) -> ViewColumns:
    """The columns of `jobs`, from the process's table."""
    return TABLE.of(jobs)


def running_jobs(jobs: tuple[Job, ...]) -> tuple[Job, ...]:
    """The running jobs of `jobs`, in their order (`ClusterView.running` from the columns)."""
    cols = TABLE.of(jobs)
    return cols.pick(np.flatnonzero(cols.state == RUNNING))


def preempted_running(jobs: tuple[Job, ...]) -> tuple[Job, ...]:
    """The running jobs of `jobs` with a preemption time still open (`preempted_since` set: a
    checkpointed job running again), in their order."""
    cols = TABLE.of(jobs)
    return cols.pick(np.flatnonzero((cols.state == RUNNING) & ~np.isnan(cols.preempted_since)))


__all__ = [
    "HELD",
    "PENDING",
    "RUNNING",
    "STATES",
    "TABLE",
    "JobColumns",
    "Strings",
    "ViewColumns",
    "columns",
    "pick",
    "preempted_running",
    "running_jobs",
]
