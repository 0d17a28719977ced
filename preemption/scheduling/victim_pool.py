"""The running jobs one scheduling pass may checkpoint, kept up to date as the pass moves.

Why a pool of its own: `PassState.preempt_for` used to find its candidates by scanning every
job of the view, and rebuilt a whole ClusterView to price them, once per interactive job that
did not fit — at a site's size (120,000 jobs, hundreds of interactive jobs waiting) that was
most of the agent's tick (issue 37). What makes a job a candidate changes only when the pass
starts a batch job (one more) or checkpoints one (one fewer): the nodes a candidate holds and
the images they run do not move while the pass runs (the pass only hands out free nodes and
victims' nodes). So the pool is built once per pass, and under the vjob policy (victims by
cost) its members are kept sorted per image in `choose_victims`' order, so that a preemption
reads only the cheapest few instead of sorting all of them.

Same answers as before, to the victim: `cheapest` walks the members in exactly the order
`choose_victims` sorts them and applies its rule (`victims.greedy_victims`).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import NamedTuple

from preemption.scheduling.victims import MIB, Candidate, greedy_victims, victim_key
from vjob.model import ClusterView, Job, JobClass


class Member(NamedTuple):
    """A candidate victim, reduced to what choosing it reads."""

    job_id: str
    nodes: tuple[str, ...]
    """The usable nodes it holds, in its allocation order (all freed when checkpointed)."""
    preempt_count: int
    checkpoint_bytes: float


Entry = tuple[tuple[float, float, float, str], Candidate]
"""A member's place in a ranked list (`victim_key`) and its Candidate."""


def vm_bytes(view: ClusterView) -> dict[str, int]:
    """Job id → the memory of its VMs in bytes, for the jobs the view has VMs of (one pass
    over the VMs, instead of one per candidate)."""
    out: dict[str, int] = {}
    for vm in view.vms:
        out[vm.job_id] = out.get(vm.job_id, 0) + vm.memory_mb * MIB
    return out


def admitted(
    job: Job,
    owner: Mapping[str, str | None],
    allowed: Collection[str] | None,
    most: int | None,
    vms: Mapping[str, int],
) -> Member | None:
    """`job` as a member of the pool (VictimPool.admits' rule, `add`'s checkpoint size) with
    the usable nodes it holds (`owner`: node → the job holding it), None when it is not one.
    One function for the pass's first members (VictimPool.fill) and the start kept from pass
    to pass (running_base): 20,000 calls of `admits` and `add` were a tenth of the pass."""
    if job.job_class is not JobClass.BATCH:
        return None
    jid = job.id
    if (allowed is not None and jid not in allowed) or (most is not None and job.preempt_count >= most):
        return None
    alloc = job.allocated_nodes
    if len(alloc) == 1:
        if owner.get(alloc[0]) != jid:
            return None
        nodes = alloc
    else:
        nodes = tuple(n for n in alloc if owner.get(n) == jid)
        if not nodes:
            return None
    held = vms.get(jid)
    size = float(held) if held is not None else float(job.memory_mb) * MIB * len(alloc)
    return Member(jid, nodes, job.preempt_count, size)


class VictimPool:
    """The running batch jobs a pass may checkpoint: those it may (`checkpointable`, under
    vjob preempted fewer than `max_preemptions` times) that hold a node of their own."""

    def __init__(
        self,
        checkpointable: Collection[str] | None,
        max_preemptions: int | None,
        vms: Mapping[str, int],
        node_os: Mapping[str, str],
    ) -> None:
        """`node_os`: the pass's node → image map (read live: a member's nodes keep theirs)."""
        self.checkpointable = checkpointable
        self.max_preemptions = max_preemptions
        self.vms = vms
        self.members: dict[str, Member] = {}
        self.nodes = 0
        """How many nodes checkpointing every member would free."""
        self._ranked: dict[str, list[Entry]] = {}
        """Image → the members as `Candidate`s under vjob's cost, in `choose_victims`' order."""
        self._node_os = node_os
        self._start: tuple[Mapping[str, Member], Mapping[str, str]] | None = None
        """The members and node images of the pass's start this pool was adopted from."""
        self._ranked_of: Callable[[str], list[Entry]] | None = None

    def admits(self, job: Job) -> bool:
        """Whether running `job` may be a victim at all (before its nodes are looked at)."""
        return (
            job.job_class is JobClass.BATCH
            and (self.checkpointable is None or job.id in self.checkpointable)
            and (self.max_preemptions is None or job.preempt_count < self.max_preemptions)
        )

    def add(self, job: Job, nodes: tuple[str, ...]) -> None:
        """`job` runs on `nodes` (those it holds): a candidate from now on, if admitted."""
        if not nodes or not self.admits(job):
            return
        held = self.vms.get(job.id)
        # checkpoint_bytes' rule: the VMs' memory, else memory_mb per allocated node
        size = float(held) if held is not None else float(job.memory_mb) * MIB * len(job.allocated_nodes)
        member = Member(job.id, nodes, job.preempt_count, size)
        self.members[job.id] = member
        self.nodes += len(nodes)
        for image, ranked in self._ranked.items():
            insort(ranked, self._entry(member, image))

    def fill(self, running: Sequence[Job], owner: Mapping[str, str | None]) -> None:
        """`add` for each of `running` (the pass's running jobs as it starts) with the usable
        nodes it holds (`owner`: node → the job holding it): the same members, in the same
        order, with `admits`' rule and `add`'s size written out in one loop (20,000 calls of
        each cost a tenth of the pass at a site's size)."""
        if self._ranked:  # a pool already ranked keeps its order through `add`
            for job in running:
                if self.admits(job):
                    self.add(job, tuple(n for n in job.allocated_nodes if owner.get(n) == job.id))
            return
        members = self.members
        for job in running:
            member = admitted(job, owner, self.checkpointable, self.max_preemptions, self.vms)
            if member is not None:
                members[job.id] = member
                self.nodes += len(member.nodes)

    def remove(self, job_id: str) -> None:
        """`job_id` is checkpointed by this pass: no longer a candidate, and out of the ranked
        lists (found by its key: else the cheapest, taken first, would be stepped over again
        by every later preemption of the pass)."""
        member = self.members.pop(job_id, None)
        if member is None:
            return
        self.nodes -= len(member.nodes)
        for image, ranked in self._ranked.items():
            entry = self._entry(member, image)
            at = bisect_left(ranked, entry)
            if at < len(ranked) and ranked[at][1].job_id == job_id:
                del ranked[at]
            else:  # its entry was made on other images (never, as the pass moves): by its id
                ranked[:] = [e for e in ranked if e[1].job_id != job_id]

    def candidates(self, image: str, prio: Mapping[str, float]) -> list[Candidate]:
        """Every member as a `Candidate` for a job asking for `image`, priced by `prio`."""
        return [
            Candidate(m.job_id, prio[m.job_id], len(m.nodes), _on_image(m, image, self._node_os), m.checkpoint_bytes)
            for m in self.members.values()
        ]

    def cheapest(self, want: int, image: str) -> list[Candidate] | None:
        """`choose_victims(want, candidates)` with each member priced by its preempt count
        (vjob's cost), read from the members kept in that order for `image`."""
        ranked = self._ranked.get(image)
        if ranked is None:
            ranked = self._rank(image)
            self._ranked[image] = ranked
        members = self.members
        return greedy_victims(want, (c for _, c in ranked if c.job_id in members))

    def _rank(self, image: str) -> list[Entry]:
        """`sorted(self._entry(m, image) for m in members)` (`rank`); a pool adopted from the
        pass's start (`adopt`) takes the start's list and the pass's own changes to it."""
        if self._start is not None and self._ranked_of is not None:
            start, start_os = self._start
            out = list(self._ranked_of(image))  # the start's list, less the members the pass took out
            for jid, member in start.items():
                if self.members.get(jid) is not member:  # its entry made on the start's images
                    del out[bisect_left(out, entry(member, image, start_os))]
            for jid, member in self.members.items():  # and with those it put in
                if start.get(jid) is not member:
                    insort(out, entry(member, image, self._node_os))
            return out
        return rank(self.members.values(), image, self._node_os)

    def _entry(self, member: Member, image: str) -> Entry:
        return entry(member, image, self._node_os)

    def adopt(
        self,
        members: Mapping[str, Member],
        nodes: int,
        ranked: Mapping[str, list[Entry]],
        node_os: Mapping[str, str],
        ranked_of: Callable[[str], list[Entry]],
    ) -> None:
        """Start from the pass's start kept from the last pass (running_base.py), copied:
        its `members`, their `nodes`, the lists it has `ranked` (instead of `fill`), made on
        its `node_os`; `ranked_of(image)`: the start's members ranked for an image it has not
        ranked yet (kept unchanged: this pass's own changes are made on a copy)."""
        self.members = dict(members)
        self.nodes = nodes
        self._ranked = {image: list(entries) for image, entries in ranked.items()}
        self._start = (members, node_os)
        self._ranked_of = ranked_of


def rank(members: Iterable[Member], image: str, node_os: Mapping[str, str]) -> list[Entry]:
    """`sorted(entry(m, image, node_os) for m in members)`, `entry` and `_on_image` written
    out in one loop (9,000 members at a site's size, two calls each were most of it)."""
    out = []
    for m in members:
        nodes = m.nodes
        count = len(nodes)
        if count == 1:
            on = 1 if node_os[nodes[0]] == image else 0
        else:
            on = sum(1 for n in nodes if node_os[n] == image)
        cand = Candidate(m.job_id, float(m.preempt_count), count, on, m.checkpoint_bytes)
        out.append(((cand.priority, -(on / count) if count else 0.0, cand.checkpoint_bytes, cand.job_id), cand))
    out.sort()
    return out


def entry(member: Member, image: str, node_os: Mapping[str, str]) -> Entry:
    """A member's place in the list ranked for `image` (`victim_key`) and its Candidate."""
    cand = Candidate(
        member.job_id,
        float(member.preempt_count),
        len(member.nodes),
        _on_image(member, image, node_os),
        member.checkpoint_bytes,
    )
    return victim_key(cand), cand


def _on_image(member: Member, image: str, node_os: Mapping[str, str]) -> int:
    nodes = member.nodes
    if len(nodes) == 1:  # most members: no generator for one node (9,000 of them at a site's size)
        return 1 if node_os[nodes[0]] == image else 0
    return sum(1 for n in nodes if node_os[n] == image)
