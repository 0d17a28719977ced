"""What a scheduling pass starts from about the running jobs, kept from pass to pass.

Why: every pass (`PassState`) begins with the same derivation from the running jobs — who
holds which usable node, what holds nodes until when (EASY's reservation), the victim pool's
members and, once a preemption asks, the pool ranked per image. At a site's size that is
20,000 running jobs and 9,000 ranked members, a quarter of the agent's decision, at every
tick; yet between two ticks a few dozen running jobs start or end. The agent's Slurm adapter
hands an unchanged job back as the same object (a Job is frozen), and the nodes likewise, so
the last pass's start is brought up to date by the jobs that came and went, found by object
identity, and the pass works on copies of it.

Same start as derived afresh, to the bit. A node two running jobs name (shared nodes: two
jobs a node in the bench) is held by the last of them in the view's order, as the former loop
left it: each node keeps its claimants, and a node a job that came or went claimed is given
to its last claimant again, the pool asked again for every job on it. The jobs that stay must
keep their order in the view, the usable nodes must be the same objects, and at most a
quarter of the running jobs may have moved (with the pool's admission: checkpointable ids,
VMs); else the start is derived afresh. The holds and the pool's members are compared as
sets (dict order: the pass sorts them), the ranked lists are sorted by a total key.
tests/test_running_base.py holds the two equal on many seeded sequences of views.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, insort
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from itertools import compress, filterfalse
from operator import is_

from preemption.scheduling.victim_pool import Entry, Member, admitted, entry, rank
from vjob.model import Job, Node

Rule = tuple[frozenset[str] | None, int | None, dict[str, int]]
"""The pool's admission: checkpointable ids (None: all), max preemptions, the VMs' bytes by job."""
DEFAULT_ESTIMATE_S = 3600.0
"""A job's run time estimate when it has no walltime (EASY needs one)."""


def estimate(job: Job) -> float:
    """The run time EASY counts on: the job's walltime, else DEFAULT_ESTIMATE_S (here, below
    pass_state, which imports it: the holds of the kept start are EASY's too)."""
    return job.walltime if job.walltime is not None and job.walltime > 0 else DEFAULT_ESTIMATE_S


@dataclass
class Base:
    """The pass's start from the running jobs (what `PassState.__init__` derived in place)."""

    nodes: tuple[Node, ...]
    """The view's nodes these were derived for (compared by identity)."""
    node_order: list[str]
    node_os: dict[str, str]
    owner: dict[str, str | None]
    holds: dict[tuple[str, str], tuple[float, int]]
    free: int
    jobs: dict[str, Job]
    """The running jobs by id."""
    objects: dict[int, Job]
    """`id()` → running Job object (held, so that its `id()` stays its own)."""
    members: dict[str, Member]
    member_nodes: int
    rule: Rule
    """The pool's admission: checkpointable ids, max preemptions, the VMs' bytes by job."""
    open_ended: set[str] = field(default_factory=set)
    """Running jobs without a start time: their hold ends `now`, moved at every pass."""
    now: float = 0.0
    ranked: dict[str, list[Entry]] = field(default_factory=dict)
    """Image → the members ranked in `choose_victims`' order (made when a pass first asks)."""
    order: list[int] = field(default_factory=list)
    """The running jobs' `id()`s, in the view's order (the last one met on a node holds it)."""
    claims: dict[str, list[Job]] = field(default_factory=dict)
    """Usable node → the running jobs whose allocation names it, in the view's order."""


class Bases:
    """The last pass's Base, and the rule that brings it up to date or derives it afresh."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last: Base | None = None
        self.reused = 0
        """How many passes started from the last base brought up to date (for the tests)."""

    def clear(self) -> None:
        with self.lock:
            self.last = None

    def base(
        self,
        nodes: tuple[Node, ...],
        running: Sequence[Job],
        checkpointable: Collection[str] | None,
        max_preemptions: int | None,
        vms: dict[str, int],
        now: float,
    ) -> Base:
        """The Base of these running jobs on these nodes (shared: copy before changing it)."""
        rule = (None if checkpointable is None else frozenset(checkpointable), max_preemptions, vms)
        with self.lock:
            last = self.last
            if last is not None and _update(last, nodes, running, rule, now):
                self.reused += 1
                return last
            self.last = fresh(nodes, running, rule, now)
            return self.last

    def ranked(self, base: Base, image: str) -> list[Entry]:
        """`base`'s members ranked for `image`, made once and then kept up to date."""
        with self.lock:
            out = base.ranked.get(image)
            if out is None:
                out = base.ranked[image] = rank(base.members.values(), image, base.node_os)
            return out


BASES = Bases()
"""The process's last pass start (the agent's ticks; the tests' views). A pass copies what it
changes and reads the start's members while it runs: passes run one at a time in a process
(the agent's loop), as `ubis_priority.job_columns.TABLE` assumes too."""


def fresh(nodes: tuple[Node, ...], running: Sequence[Job], rule: Rule, now: float) -> Base:
    """The Base derived from every running job (the former `PassState.__init__` loop)."""
    usable = [n for n in nodes if n.state.usable]
    node_order = [n.name for n in usable]
    base = Base(
        nodes=nodes,
        node_order=node_order,
        node_os={n.name: n.os_image for n in usable},
        owner=dict.fromkeys(node_order),
        holds={},
        free=0,
        jobs={},
        objects={},
        members={},
        member_nodes=0,
        rule=rule,
        now=now,
        order=list(map(id, running)),
    )
    owner = base.owner
    for job in running:
        for n in _hold(base, job):
            owner[n] = job.id
    base.free = list(owner.values()).count(None)
    for job in running:  # against the final owners, as `VictimPool.fill` was
        _admit(base, job)
    return base


def _hold(base: Base, job: Job) -> list[str]:
    """`job` runs: its hold and its claims on the usable nodes of its allocation (returned,
    once each, in its allocation's order); who holds a node is the caller's."""
    owner, claims = base.owner, base.claims
    jid = job.id
    base.jobs[jid] = job
    base.objects[id(job)] = job
    held = 0
    mine: list[str] = []
    for n in job.allocated_nodes:
        if n in owner:
            held += 1
            if n not in mine:
                mine.append(n)
                claims.setdefault(n, []).append(job)
    if held:
        base.holds[("run", jid)] = (now_or_end(job, base.now), held)
        if job.start_time is None:
            base.open_ended.add(jid)
    return mine


def now_or_end(job: Job, now: float) -> float:
    """The end of a running job's hold: its start plus its estimate (`now` without a start)."""
    return now if job.start_time is None else job.start_time + estimate(job)


def _admit(base: Base, job: Job) -> None:
    """`job` into the pool when the rule admits it and it holds a node of its own
    (`VictimPool.fill`, for one job)."""
    member = admitted(job, base.owner, *base.rule)
    if member is None:
        return
    base.members[member.job_id] = member
    base.member_nodes += len(member.nodes)
    for image, ranked in base.ranked.items():
        insort(ranked, entry(member, image, base.node_os))


def _drop_member(base: Base, jid: str) -> None:
    member = base.members.pop(jid, None)
    if member is None:
        return
    base.member_nodes -= len(member.nodes)
    for image, ranked in base.ranked.items():
        del ranked[bisect_left(ranked, entry(member, image, base.node_os))]  # each member has its entry


def _remove(base: Base, job: Job) -> list[str]:
    """`job` no longer runs: its hold, claims and membership gone; the nodes it claimed."""
    jid = job.id
    del base.objects[id(job)]
    if base.jobs.get(jid) is job:
        del base.jobs[jid]
    base.holds.pop(("run", jid), None)
    base.open_ended.discard(jid)
    _drop_member(base, jid)
    mine = []
    claims = base.claims
    for n in job.allocated_nodes:
        on = claims.get(n)
        if on is not None and any(c is job for c in on):
            on[:] = [c for c in on if c is not job]
            mine.append(n)
    return mine


def _update(base: Base, nodes: tuple[Node, ...], running: Sequence[Job], rule: Rule, now: float) -> bool:
    """Bring `base` up to date for these running jobs; False when it must be derived afresh
    (it may be half changed then: the caller replaces it)."""
    if len(nodes) != len(base.nodes) or not all(map(is_, nodes, base.nodes)):
        return False
    allowed, most, vms = rule
    if most != base.rule[1] or (allowed is None) != (base.rule[0] is None):
        return False
    seen = base.objects
    order = list(map(id, running))  # the objects' ids, each job's identity met in C
    now_ids = set(order)
    if len(now_ids) != len(order):
        return False
    gone_ids = seen.keys() - now_ids
    came_ids = now_ids - seen.keys()
    moved: set[str] = set()
    if allowed is not None and base.rule[0] is not None and allowed != base.rule[0]:
        moved |= allowed ^ base.rule[0]
    if vms != base.rule[2]:
        old = base.rule[2]
        moved |= {k for k in vms.keys() | old.keys() if vms.get(k) != old.get(k)}
    if 4 * (len(gone_ids) + len(came_ids) + len(moved)) > len(running) + 4:
        return False
    # the jobs that stay keep their order: the last one met on a node is the same
    kept_now = list(filterfalse(came_ids.__contains__, order)) if came_ids else order
    kept_before = list(filterfalse(gone_ids.__contains__, base.order)) if gone_ids else base.order
    if kept_now != kept_before:
        return False
    touched: set[str] = set()
    for k in gone_ids:
        touched.update(_remove(base, seen[k]))
    base.rule = rule
    base.now = now
    base.order = order
    for job in compress(running, map(came_ids.__contains__, order)):
        touched.update(_hold(base, job))
    _owners(base, touched, order, moved)
    for jid in base.open_ended:
        base.holds[("run", jid)] = (now, base.holds[("run", jid)][1])
    return True


def _owners(base: Base, touched: set[str], order: list[int], moved: set[str]) -> None:
    """Who holds each node the jobs that came or went claimed (the last claimant in the view's
    order), and the pool again for every job whose own nodes or admission may have moved."""
    owner = base.owner
    again = set(moved)
    place: dict[int, int] | None = None
    for n in touched:
        on = base.claims.get(n) or []
        was = owner[n]
        if len(on) > 1:
            if place is None:
                place = dict(zip(order, range(len(order)), strict=True))
            now = max(on, key=lambda j: place[id(j)]).id  # type: ignore[index]
        else:
            now = on[0].id if on else None
        if now != was:
            base.free += (now is None) - (was is None)
            owner[n] = now
        again.update(j.id for j in on)
        if was is not None:
            again.add(was)
    for jid in again:
        job = base.jobs.get(jid)
        _drop_member(base, jid)
        if job is not None:
            _admit(base, job)
