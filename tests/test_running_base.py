"""The pass's start kept from pass to pass is the start derived afresh, and so is the pass.

preemption/scheduling/running_base.py brings the last pass's start (who holds which node, the
holds, the victim pool and its ranked lists) up to date by the running jobs that came and
went; tick.py hands the per-job mappings the tick does not read as lazy ones
(preemption/scheduling/lazy_map.py). Held here on seeded sequences of views that move as a
site does between ticks — jobs end, start (on nodes other jobs hold too), change (a new
object under the same id), become checkpointable or not, get VMs — with interactive jobs
waiting so that preemptions rank the pool: every decision equals the one made with the start
derived afresh, and the kept start equals a fresh one field by field.
"""

from __future__ import annotations

import pickle
import random
from dataclasses import replace

import pytest

from preemption.scheduling import running_base, tick
from preemption.scheduling.lazy_map import LazyMap
from preemption.scheduling.site_order import SiteOrder
from preemption.scheduling.victim_pool import vm_bytes
from ubis_priority import job_columns
from vjob.config import Config
from vjob.model import VM, ClusterView, Job, JobClass, JobState, Node, NodeState
from vjob.rms import PriorityKnob

NOW = 1_800_000_000.0
KNOB = PriorityKnob(0, 10**9, min_step=1000, share=0.5)
SPAN = 20_000
IMAGES = ("", "a", "b")


class Site:
    """A small cluster that moves from tick to tick, seeded."""

    def __init__(self, seed: int) -> None:
        self.rnd = random.Random(seed)
        self.now = NOW
        rnd = self.rnd
        self.nodes = tuple(
            Node(
                f"n{k}",
                cpus=2,
                memory_mb=8192,
                os_image=rnd.choice(IMAGES),
                state=NodeState.DOWN if rnd.random() < 0.08 else NodeState.IDLE,
            )
            for k in range(rnd.randrange(8, 40))
        )
        self.next_id = 1
        self.running: list[Job] = [self._running() for _ in range(rnd.randrange(4, 3 * len(self.nodes)))]
        self.queued: list[Job] = [self._queued() for _ in range(rnd.randrange(5, 40))]
        self.checkpointable = {j.id for j in self.running if rnd.random() < 0.8}
        self.vms: list[VM] = []

    def _id(self) -> str:
        self.next_id += 1
        return str(self.next_id)

    def _running(self) -> Job:
        rnd = self.rnd
        size = rnd.randrange(1, 4)
        names = [n.name for n in self.nodes]
        alloc = tuple(rnd.choice(names) for _ in range(size))  # shared nodes, a node twice
        return Job(
            id=self._id(),
            user=f"u{rnd.randrange(3)}",
            job_class=JobClass.BATCH if rnd.random() < 0.85 else JobClass.INTERACTIVE,
            nodes=size,
            memory_mb=rnd.choice((512, 1024)),
            os_image=rnd.choice(IMAGES),
            state=JobState.RUNNING,
            submit_time=self.now - 500,
            walltime=rnd.choice((None, 600.0, 3600.0)),
            allocated_nodes=alloc,
            start_time=None if rnd.random() < 0.05 else self.now - rnd.randrange(0, 400),
            preempt_count=rnd.randrange(0, 3),
        )

    def _queued(self) -> Job:
        rnd = self.rnd
        return Job(
            id=self._id(),
            user=f"u{rnd.randrange(3)}",
            job_class=JobClass.INTERACTIVE if rnd.random() < 0.3 else JobClass.BATCH,
            nodes=rnd.randrange(1, 5),
            memory_mb=512,
            os_image=rnd.choice(IMAGES),
            state=JobState.PENDING,
            submit_time=self.now - rnd.randrange(0, 300),
            walltime=rnd.choice((None, 900.0)),
        )

    def move(self) -> None:
        """Between two ticks: a few jobs end, start, change, arrive; the pool's rule moves."""
        rnd = self.rnd
        self.now += 10.0
        for _ in range(rnd.randrange(0, 3)):
            if self.running:
                self.running.pop(rnd.randrange(len(self.running)))
        for _ in range(rnd.randrange(0, 3)):
            self.running.insert(rnd.randrange(len(self.running) + 1), self._running())
        if self.running and rnd.random() < 0.4:  # a new object under the same id
            k = rnd.randrange(len(self.running))
            self.running[k] = replace(self.running[k], preempt_count=self.running[k].preempt_count + 1)
        ids = [j.id for j in self.running]
        if ids and rnd.random() < 0.5:
            self.checkpointable ^= {rnd.choice(ids)}
        if ids and rnd.random() < 0.3:
            self.vms.append(VM(f"vm{len(self.vms)}", rnd.choice(ids), "a", memory_mb=rnd.choice((256, 768))))
        for _ in range(rnd.randrange(0, 3)):
            self.queued.append(self._queued())

    def view(self) -> ClusterView:
        alive = {j.id for j in self.running}
        return ClusterView(
            now=self.now,
            nodes=self.nodes,
            jobs=(*self.running, *self.queued),
            vms=tuple(v for v in self.vms if v.job_id in alive),
            images=("a", "b"),
            usage={"u0": 100.0, "u1": 5.0},
        )


def _decide(view: ClusterView, site: Site, policy: str) -> tick.Decision:
    cfg = Config()
    own = {j.id: int(j.id) * 7 % 1000 for j in view.jobs}
    return tick.decide(
        view,
        cfg,
        knob=KNOB,
        checkpointable=set(site.checkpointable),
        sleeping={},
        policy=policy,
        site=SiteOrder(own, SPAN) if policy == "vjob" else None,
    )


def _same_start(kept: running_base.Base, new: running_base.Base) -> None:
    assert kept.owner == new.owner and list(kept.owner) == list(new.owner)
    assert kept.holds == new.holds
    assert kept.free == new.free == list(new.owner.values()).count(None)
    assert kept.jobs == new.jobs
    assert kept.members == new.members and kept.member_nodes == new.member_nodes
    for image, ranked in kept.ranked.items():
        assert ranked == running_base.rank(new.members.values(), image, new.node_os)


@pytest.mark.parametrize("policy", ["vjob", "ubis"])
@pytest.mark.parametrize("seed", range(25))
def test_a_kept_start_decides_as_a_fresh_one_tick_after_tick(seed: int, policy: str) -> None:
    site = Site(seed)
    bases = running_base.BASES
    bases.clear()
    reused = bases.reused
    for _ in range(12):
        view = site.view()
        kept = _decide(view, site, policy)
        start = bases.last
        assert start is not None
        cols = job_columns.columns(view.jobs)
        running = cols.pick(job_columns.np.flatnonzero(cols.state == job_columns.RUNNING))
        most = Config().scheduling.max_preemptions if policy == "vjob" else None
        rule = (frozenset(site.checkpointable), most, vm_bytes(view))
        _same_start(start, running_base.fresh(view.nodes, running, rule, view.now))
        bases.clear()  # derived afresh: the same decision
        assert _decide(view, site, policy) == kept
        bases.last = start
        site.move()
    assert bases.reused > reused, "no pass started from a kept start: the test would not see a difference"


def test_a_start_changed_in_its_nodes_or_rule_is_derived_afresh() -> None:
    site = Site(3)
    bases = running_base.BASES
    bases.clear()
    _decide(site.view(), site, "vjob")
    first = bases.last
    site.nodes = tuple(replace(n, state=NodeState.DRAINED) if k == 0 else n for k, n in enumerate(site.nodes))
    _decide(site.view(), site, "vjob")
    assert bases.last is not first  # other node objects: afresh
    second = bases.last
    _decide(site.view(), site, "vjob")
    assert bases.last is second  # nothing moved: kept


def test_a_lazy_map_is_the_dict_it_stands_for() -> None:
    lazy = LazyMap(["a", "b", "c"], job_columns.np.array([1.5, 2.0, -0.0]))
    plain = {"a": 1.5, "b": 2.0, "c": -0.0}
    assert lazy == plain and plain == lazy and repr(lazy) == repr(plain)
    assert list(lazy) == ["a", "b", "c"] and lazy["b"] == 2.0 and "c" in lazy and "d" not in lazy
    assert lazy.get("d", 7) == 7 and dict(lazy.items()) == plain and len(lazy) == 3
    assert LazyMap(["a"], [1]) != {"a": 2} and LazyMap(["a"], [1]) == LazyMap(["a"], [1])
    assert pickle.loads(pickle.dumps(lazy)) == plain
    with pytest.raises(ValueError):
        dict(LazyMap(["a", "b"], [1]))  # keys and values of unequal lengths


@pytest.mark.parametrize("seed", range(20))
def test_plain_number_ids_break_ties_as_their_ranks_do(seed: int) -> None:
    """`job_columns.id_key` stands for `tick.id_ranks` in the pass's tie-break when every
    queued id is a plain number: the same order, ties of priority and submission many."""
    rnd = random.Random(seed)
    ids = sorted({str(rnd.choice((rnd.randrange(0, 12), rnd.randrange(0, 10**17)))) for _ in range(60)})
    rnd.shuffle(ids)
    keys = job_columns.np.array([job_columns.id_key(i) for i in ids])
    jobs = [Job(id=i, user="u", nodes=1) for i in ids]
    submit = job_columns.np.array([float(rnd.randrange(3)) for _ in ids])
    assert (keys >= 0).all()
    by_key = job_columns.np.lexsort((keys, submit))
    by_rank = job_columns.np.lexsort((tick.id_ranks(jobs), submit))
    assert by_key.tolist() == by_rank.tolist()


def test_ids_that_are_not_plain_numbers_have_no_key() -> None:
    for odd in ("007", "7_2", "9.server", "1e3", "²", "-1", "1234567890123456789", " 7"):
        assert job_columns.id_key(odd) == -1, odd
    assert [job_columns.id_key(i) for i in ("0", "7", "120000")] == [0, 7, 120000]
