"""The vjob policy orders each tier by the UBIS priority: a weight or a user's share moves
jobs inside their tier, never across tiers (issue 34 item 1).

What is checked, on a hand-made queue where every tier holds a job and one tier two:

* with the default weights the older batch job of a heavy user comes first; raising the usage
  weight alone (or giving the light user a target) puts the light user's job first, and the
  RMS's priorities (`rms_priorities`, what the agent sends to Slurm/PBS) follow;
* the interactive job within the cap and the checkpointed job stay ahead of both batch jobs
  even where the weights give a batch job the higher priority (checked, so the test cannot
  pass by the priorities happening to agree with the tiers);
* the job backfilled beside the head is the first of the tier in the new order;
* a replay under vjob changes its schedule when one weight changes, one under mms does not,
  and the compiled order and the whole-queue `lexsort` give the same schedule.
"""

from __future__ import annotations

import numpy as np

from preemption.scheduling.policies import TIER_NAMES
from preemption.scheduling.tick import Decision, decide, id_ranks
from simulator.engine import Simulation, simulate
from simulator.lublin import generate
from simulator.metrics import schedule_digest
from simulator.replay import ClusterModel
from simulator.setup import UbisSetup, apply
from vjob.config import Config, PriorityConfig, PriorityWeights, SchedulingConfig
from vjob.model import ClusterView, Job, JobClass, JobState, Node
from vjob.rms import PriorityKnob

NOW = 2_000_000.0
DAY = 86_400.0
KNOB = PriorityKnob(low=0, high=1_000_000, min_step=1_000)


def _view() -> ClusterView:
    """Eight nodes on image deb, four busy with alice's job for two more days; alice has used
    much, bob nothing. Queued: bob's interactive job (1 node of centos, within a 50 % cap),
    alice's 6-node job checkpointed once (the head: it waits for alice's nodes), alice's
    batch job `old` (3 days waiting) and bob's batch job `new` (1 hour), 2 nodes for a day
    each: after the interactive job 3 nodes are free, room to backfill one of them."""
    nodes = tuple(Node(f"n{i}", cpus=1, memory_mb=8192, os_image="deb") for i in range(8))
    jobs = (
        Job(
            id="r",
            user="alice",
            os_image="deb",
            nodes=4,
            submit_time=NOW - 2 * DAY,
            start_time=NOW - DAY,
            walltime=3 * DAY,
            state=JobState.RUNNING,
            allocated_nodes=("n0", "n1", "n2", "n3"),
        ),
        Job(id="i", user="bob", os_image="centos", job_class=JobClass.INTERACTIVE, nodes=1, submit_time=NOW - 60),
        Job(id="c", user="alice", os_image="deb", nodes=6, submit_time=NOW - 600, preempt_count=1),
        Job(id="old", user="alice", os_image="deb", nodes=2, submit_time=NOW - 3 * DAY, walltime=DAY),
        Job(id="new", user="bob", os_image="deb", nodes=2, submit_time=NOW - 3600, walltime=DAY),
    )
    return ClusterView(now=NOW, nodes=nodes, jobs=jobs, usage={"alice": 1e9, "bob": 0.0})


def _decide(weights: PriorityWeights | None = None, targets: dict[str, float] | None = None) -> Decision:
    prio = PriorityConfig(interactive_cap=0.5, weights=weights or PriorityWeights(), targets=targets or {})
    cfg = Config(priority=prio, scheduling=SchedulingConfig(policy="vjob", tier_order="ubis"))
    return decide(_view(), cfg, knob=KNOB, checkpointable=(), sleeping={})


def test_the_usage_weight_reorders_the_batch_tier_and_what_the_rms_gets() -> None:
    paper = _decide()
    assert paper.order == ("i", "c", "old", "new")
    assert paper.priorities["old"] > paper.priorities["new"]
    heavy_usage = _decide(PriorityWeights(usage=0.5))
    assert heavy_usage.order == ("i", "c", "new", "old")
    assert heavy_usage.rms_priorities["new"] > heavy_usage.rms_priorities["old"]
    assert paper.rms_priorities["old"] > paper.rms_priorities["new"]
    # the first of the two in the order is the one backfilled beside the head
    assert paper.reserved == heavy_usage.reserved == "c"
    assert paper.starts == ("i", "old") and heavy_usage.starts == ("i", "new")


def test_a_users_target_reorders_the_batch_tier() -> None:
    """Fair share: bob's target of 0.9 (alice gets what is left) lifts his job over alice's
    older one with the paper's weights."""
    assert _decide(targets={"bob": 0.9}).order == ("i", "c", "new", "old")


def test_no_weight_lifts_a_job_across_tiers() -> None:
    """With the interactive and preemption weights at 0 and the node terms high, the batch
    jobs outrank the interactive and the checkpointed job by priority; the tiers still hold."""
    weights = PriorityWeights(
        usage=0.5, queue_time=0.0, os_available=1.0, preempt_count=0.0, preempt_time=0.0, free_nodes=1.0, interactive=0
    )
    d = _decide(weights)
    assert d.priorities["new"] > d.priorities["c"] and d.priorities["new"] > d.priorities["i"]
    assert d.order == ("i", "c", "new", "old")
    assert {job: TIER_NAMES[t] for job, t in d.tiers.items()} == {
        "i": "interactive",
        "c": "checkpointed",
        "old": "batch",
        "new": "batch",
    }
    ranks = [d.rms_priorities[j] for j in d.order]
    assert ranks == sorted(ranks, reverse=True) and len(set(ranks)) == len(ranks)


def test_equal_priorities_and_submissions_go_to_the_lower_id() -> None:
    """Numeric ids in numeric order (the simulator breaks the same tie by job index)."""
    jobs = [Job(id=i, user="u", nodes=1) for i in ("10", "9", "100", "7_10", "7_2")]
    assert [jobs[k].id for k in np.argsort(id_ranks(jobs))] == ["9", "10", "100", "7_2", "7_10"]


UBIS_TIERS = SchedulingConfig(tier_order="ubis")


def _workload() -> tuple[object, ClusterModel]:
    base = generate(64, 400, seed=3, load=0.9)
    return apply(base, 64, UbisSetup(interactive_frac=0.2, interactive_mean_size=6, seed=3)), ClusterModel(nodes=64)


def test_a_weight_changes_a_vjob_replay_and_not_an_mms_one() -> None:
    workload, model = _workload()
    paper = PriorityConfig(interactive_cap=0.15)
    changed = PriorityConfig(interactive_cap=0.15, weights=PriorityWeights(os_available=0.5))
    digests = {
        (policy, name): schedule_digest(simulate(workload, model, policy, cfg, scheduling=UBIS_TIERS))  # type: ignore[arg-type]
        for policy in ("vjob", "mms")
        for name, cfg in (("paper", paper), ("changed", changed))
    }
    assert digests["vjob", "paper"] != digests["vjob", "changed"]
    assert digests["mms", "paper"] == digests["mms", "changed"]


def test_the_compiled_order_schedules_as_the_whole_queue_sort() -> None:
    """bench/simulate.py's baseline (`Rules.full_sort_vjob`: `policies.vjob_order`'s lexsort
    at every pass) and the compiled order give one schedule, with preemptions in it."""
    workload, model = _workload()
    prio = PriorityConfig(interactive_cap=0.15)
    compiled = simulate(workload, model, "vjob", prio, scheduling=UBIS_TIERS)  # type: ignore[arg-type]
    sim = Simulation(workload, model, "vjob", prio, scheduling=UBIS_TIERS)  # type: ignore[arg-type]
    sim.rules.full_sort_vjob = True
    assert compiled.preemptions > 0
    assert schedule_digest(sim.run()) == schedule_digest(compiled)


def _two_interactive(tier_order: str, weights: PriorityWeights | None = None) -> Decision:
    """`_view` with a second interactive job within the cap: alice's, older than bob's and on
    the nodes' image (so the node terms favour it), while alice's heavy usage counts against
    it; both fit the 4 free nodes only one at a time beside the backfill (2 + 1 of 3)."""
    view = _view()
    alices = Job(id="j", user="alice", os_image="deb", job_class=JobClass.INTERACTIVE, nodes=2, submit_time=NOW - 120)
    view = ClusterView(now=view.now, nodes=view.nodes, jobs=(*view.jobs, alices), usage=view.usage)
    prio = PriorityConfig(interactive_cap=0.5, weights=weights or PriorityWeights())
    cfg = Config(priority=prio, scheduling=SchedulingConfig(policy="vjob", tier_order=tier_order))  # type: ignore[arg-type]
    return decide(view, cfg, knob=KNOB, checkpointable=(), sleeping={})


def test_ubis_interactive_ranks_the_interactive_tier_and_leaves_the_batch_tier_by_submission() -> None:
    """`tier_order = "ubis-interactive"`: the interactive tier follows the weights (the usage
    weight raised puts bob's later job ahead of alice's), the batch tier stays in submission
    order even where "ubis" reorders it (checked with the same weights)."""
    usage = PriorityWeights(usage=0.5)
    submit = _two_interactive("submit", usage)
    ranked = _two_interactive("ubis-interactive", usage)
    everywhere = _two_interactive("ubis", usage)
    assert submit.priorities["i"] > submit.priorities["j"]  # the weights favour bob's job ...
    assert submit.order == ("j", "i", "c", "old", "new")  # ... which the submission order ignores
    assert ranked.order == ("i", "j", "c", "old", "new")
    assert everywhere.order == ("i", "j", "c", "new", "old")  # "ubis" also reorders the batch tier
    no_usage = _two_interactive("ubis-interactive", PriorityWeights(usage=0.0))  # the node terms decide
    assert no_usage.priorities["j"] > no_usage.priorities["i"] and no_usage.order[:2] == ("j", "i")
    assert ranked.rms_priorities["i"] > ranked.rms_priorities["j"] > ranked.rms_priorities["c"]


UBIS_INTERACTIVE = SchedulingConfig(tier_order="ubis-interactive")


def test_ubis_interactive_replays_move_with_a_weight_and_agree_with_the_whole_queue_sort() -> None:
    """A replay under "ubis-interactive" changes with one weight (the interactive tier is
    ranked), and the compiled order gives `full_sort_vjob`'s schedule, with preemptions."""
    workload, model = _workload()
    paper = PriorityConfig(interactive_cap=0.15)
    # the node terms off: the interactive tier goes by fair share and queue time instead
    changed = PriorityConfig(interactive_cap=0.15, weights=PriorityWeights(os_available=0.0, free_nodes=0.0))
    compiled = simulate(workload, model, "vjob", paper, scheduling=UBIS_INTERACTIVE)  # type: ignore[arg-type]
    other = simulate(workload, model, "vjob", changed, scheduling=UBIS_INTERACTIVE)  # type: ignore[arg-type]
    submit = simulate(workload, model, "vjob", paper)  # type: ignore[arg-type]
    assert compiled.preemptions > 0
    assert schedule_digest(compiled) != schedule_digest(other)
    assert schedule_digest(compiled) != schedule_digest(submit)
    sim = Simulation(workload, model, "vjob", paper, scheduling=UBIS_INTERACTIVE)  # type: ignore[arg-type]
    sim.rules.full_sort_vjob = True
    assert schedule_digest(sim.run()) == schedule_digest(compiled)
