"""vjob's order and the site's own priority combined (issue 34 item 2): the pure function, the
pass that walks the order Slurm will follow, and the Slurm readings it needs.

What is checked:

* the combination (tier, vjob's share, the site's own priority → what the RMS holds): a tier
  always beats every fair share and UBIS priority below it; with share 0 the site's own
  priority alone orders a tier, with 0.5 vjob's UBIS fraction weighs as much as the site's
  whole span; a job outside the queue stays below every queued one;
* `decide` with the site's priorities: a later batch job of a user with the better fair
  share is walked first, becomes the head the guard protects and keeps the reservation, the
  older job is not backfilled past it; with share 1 or no reading the former whole order
  (`_rank_priorities`) is sent unchanged;
* vjob's part moves in whole steps, and the agent sends the bands exactly: the former rule
  kept an old value still in order (a job that left the interactive tier stayed on top);
* the span read from a recorded `scontrol show config` of the dev cluster, TRES weights
  counted, an unknown layout refused; bands that do not fit `site_factor_max` refused
  naming both settings; `[slurm] order_share` validated.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.act import priorities_to_send
from agent.site_read import resync
from plugins.slurm.commands import SlurmCommands
from plugins.slurm.site_priority import SiteReader, weight_span
from preemption.scheduling.site_order import (
    TIERS,
    SiteOrder,
    band,
    needed_range,
    site_value,
    vjob_width,
    walk_order,
)
from preemption.scheduling.tick import _rank_priorities, decide
from vjob.config import Config, PriorityConfig, SchedulingConfig, parse
from vjob.errors import CommandError, ConfigError, InputError
from vjob.model import ClusterView, Job, JobClass, JobState, Node
from vjob.rms import PriorityKnob

NOW = 2_000_000.0
SPAN = 12_000  # the dev cluster: PriorityWeightFairshare 10000 + Age 1000 + Partition 1000
SHARED = PriorityKnob(0, 1_000_000, min_step=1_000, share=0.5)

CONFIG = """\
PriorityParameters      = (null)
PrioritySiteFactorParameters = (null)
PrioritySiteFactorPlugin = (null)
PriorityDecayHalfLife   = 7-00:00:00
PriorityCalcPeriod      = 00:01:00
PriorityFavorSmall      = No
PriorityFlags           = {blank}
PriorityMaxAge          = 7-00:00:00
PriorityUsageResetPeriod = NONE
PriorityType            = priority/multifactor
PriorityWeightAge       = 1000
PriorityWeightAssoc     = 0
PriorityWeightFairShare = 10000
PriorityWeightJobSize   = 0
PriorityWeightPartition = 1000
PriorityWeightQOS       = 0
PriorityWeightTRES      = (null)
""".format(blank="")
"""`scontrol show config` of the dev cluster (Slurm 22.05.8), its Priority* lines as printed
(`PriorityFlags` ends in a blank there)."""


def test_the_band_holds_the_site_span_and_vjobs_part() -> None:
    assert vjob_width(SPAN, 0.0) == 0 and vjob_width(SPAN, 0.5) == SPAN and vjob_width(SPAN, 0.75) == 3 * SPAN
    assert band(SPAN, 0.5) == 2 * SPAN + 1
    assert needed_range(SPAN, 0.5) == (TIERS + 1) * (2 * SPAN + 1) - 1 == 120_004
    # batch (tier 3) sits in the second band, the interactive tier in the top one
    assert site_value(3, 0.0, 0.5, SPAN) == 24_001 and site_value(0, 1.0, 0.5, SPAN) == 4 * 24_001 + SPAN
    with pytest.raises(ValueError, match="below 1"):
        vjob_width(SPAN, 1.0)
    with pytest.raises(ValueError, match="tier 4"):
        site_value(4, 0.0, 0.5, SPAN)


@given(
    st.integers(0, TIERS - 2),
    st.integers(1, TIERS - 1),
    st.floats(0.0, 0.95),
    st.integers(0, 200_000),
    st.floats(0.0, 1.0),
    st.floats(0.0, 1.0),
    st.floats(0.0, 1.0),
    st.floats(0.0, 1.0),
)
def test_a_tier_beats_every_fair_share_and_ubis_priority_below_it(
    hi: int, gap: int, share: float, span: int, f_hi: float, f_lo: float, own_hi: float, own_lo: float
) -> None:
    lo = min(TIERS - 1, hi + gap)
    if lo == hi:
        return
    upper = site_value(hi, f_hi, share, span) + round(own_hi * span)  # the site's worst job in the upper tier
    lower = site_value(lo, f_lo, share, span) + round(own_lo * span)
    assert upper > lower
    assert site_value(TIERS - 1, 0.0, share, span) > 0  # above a job outside the queue (the knob's low)


def test_share_zero_leaves_the_tier_to_the_site_and_one_half_weighs_ubis_as_much() -> None:
    own = {"a": 9_000, "b": 3_000}  # a: the better fair share
    ubis = {"a": 0.1, "b": 0.9}  # vjob prefers b
    for share, first in ((0.0, "a"), (0.3, "a"), (0.6, "b")):
        held = {j: site_value(3, ubis[j], share, SPAN) + own[j] for j in own}
        assert max(held, key=held.get) == first, (share, held)  # type: ignore[arg-type]
    # at 0.5, vjob's difference 0.8 x 12000 = 9600 just outweighs the site's 6000
    held = {j: site_value(3, ubis[j], 0.5, SPAN) + own[j] for j in own}
    assert held["b"] - held["a"] == round(0.8 * SPAN) - 6_000


def test_walk_order_follows_what_the_rms_will_hold_ties_in_vjobs_order() -> None:
    jobs = [Job(id=k, user="u") for k in ("x", "y", "z")]
    sent = {"x": 100, "y": 100, "z": 100}
    assert [j.id for j in walk_order(jobs, sent, {"z": 5})] == ["z", "x", "y"]
    assert [j.id for j in walk_order(jobs, sent, {})] == ["x", "y", "z"]  # equal: vjob's (Slurm: job id)


def _view() -> ClusterView:
    """Eight nodes, six busy with a job of carol for an hour. Queued: bob's interactive job (1
    node, within a 50 % cap, the worst fair share), alice's batch job `old` (8 nodes, waiting
    a day) and bob's batch job `late` (8 nodes, 10 minutes), then alice's small job `small`
    (2 nodes for 10 hours: it fits beside the head but would delay it). carol holds a job herself."""
    nodes = tuple(Node(f"n{i}", cpus=1, memory_mb=8192) for i in range(8))
    busy = tuple(f"n{i}" for i in range(6))
    jobs = (
        Job(
            id="r",
            user="carol",
            nodes=6,
            submit_time=NOW - 7200,
            start_time=NOW - 600,
            walltime=3600,
            state=JobState.RUNNING,
            allocated_nodes=busy,
        ),
        Job(id="i", user="bob", job_class=JobClass.INTERACTIVE, nodes=1, submit_time=NOW - 30, walltime=600),
        Job(id="old", user="alice", nodes=8, submit_time=NOW - 86_400, walltime=3600),
        Job(id="late", user="bob", nodes=8, submit_time=NOW - 600, walltime=3600),
        Job(id="small", user="alice", nodes=2, submit_time=NOW - 300, walltime=36_000),
        Job(id="h", user="carol", nodes=1, submit_time=NOW - 900, walltime=60, state=JobState.HELD),
    )
    return ClusterView(now=NOW, nodes=nodes, jobs=jobs)


CFG = Config(priority=PriorityConfig(interactive_cap=0.5), scheduling=SchedulingConfig(policy="vjob"))
# bob's fair share is the better one in the batch tier (sprio: PRIORITY - SITE); the
# interactive job's own priority is bob's too, its tier above all
OWN = {"i": 9_500, "old": 3_000, "late": 9_500, "small": 3_000}


def test_the_pass_walks_slurms_order_and_guards_the_job_slurm_starts_first() -> None:
    site = decide(_view(), CFG, knob=SHARED, checkpointable=(), sleeping={}, site=SiteOrder(OWN, SPAN))
    alone = decide(_view(), CFG, knob=SHARED, checkpointable=(), sleeping={})
    # vjob alone (submission inside the tier): alice's older job first
    assert alone.order == ("i", "old", "late", "small") and alone.reserved == "old"
    # with the site's share: bob's later job first in the tier (fair share), the tier kept
    assert site.order == ("i", "late", "old", "small")
    assert site.tiers == {"i": 0, "old": 3, "late": 3, "small": 3}
    held = {j: site.rms_priorities[j] + OWN[j] for j in OWN}
    assert sorted(held, key=lambda j: -held[j]) == list(site.order)  # what Slurm will hold, same order
    # the head is the job Slurm starts first; the small job fits beside it and is not backfilled
    assert site.reserved == "late" and site.starts == ("i",)
    assert "small" not in site.starts
    # bands: tier 0 above every batch job whatever its own priority; batch jobs differ only by it
    assert site.rms_priorities["i"] - max(site.rms_priorities[j] for j in ("old", "late")) > SPAN
    assert site.rms_priorities["old"] == site.rms_priorities["late"] == site.rms_priorities["small"]
    assert site.rms_priorities["h"] == 0  # held by its user, not queued: the knob's low


def test_share_one_or_no_reading_sends_the_former_whole_order() -> None:
    whole = PriorityKnob(0, 1_000_000, min_step=1_000, share=1.0)
    view = _view()
    owned = decide(view, CFG, knob=whole, checkpointable=(), sleeping={}, site=SiteOrder(OWN, SPAN))
    unread = decide(view, CFG, knob=SHARED, checkpointable=(), sleeping={}, site=None)
    queue = [view.job(j) for j in owned.order]
    expected = _rank_priorities(queue, owned.priorities, whole)
    assert owned.rms_priorities == expected == unread.rms_priorities
    assert owned.order == unread.order == ("i", "old", "late", "small")


def test_the_ubis_fraction_is_vjobs_part_under_tier_order_ubis() -> None:
    cfg = Config(
        priority=PriorityConfig(interactive_cap=0.5), scheduling=SchedulingConfig(policy="vjob", tier_order="ubis")
    )
    equal = dict.fromkeys(OWN, 5_000)
    d = decide(_view(), cfg, knob=SHARED, checkpointable=(), sleeping={}, site=SiteOrder(equal, SPAN))
    batch = ("old", "late", "small")
    maxp = sum(cfg.priority.weights.model_dump().values())
    for j in batch:  # band + W x P/Σw in whole steps of 1000, W = the span at share 0.5
        assert d.rms_priorities[j] == site_value(3, d.priorities[j] / maxp, 0.5, SPAN, step=SHARED.min_step)
    assert [j for j in d.order if j in batch] == sorted(batch, key=lambda j: -d.rms_priorities[j])


def test_vjobs_part_moves_in_whole_steps_and_the_agent_sends_the_bands_exactly() -> None:
    assert site_value(3, 0.55, 0.5, SPAN, step=1000) == 24_001 + 6_000  # 6600 rounded down to a step
    assert site_value(3, 1.0, 0.5, 12_500, step=1000) - band(12_500, 0.5) == 12_000  # never above W
    # J left the interactive tier; K has the better fair share: the pass walks K first
    wanted = {"J": 25_001, "K": 24_001}
    sent = {"J": 96_004, "K": 24_001}
    # the former rule keeps J's old value, still in order, and Slurm would put J first
    assert priorities_to_send(dict(sent), wanted, SHARED) == {}
    assert resync(object(), sent, log=None, exact=wanted) == ["J"]
    assert priorities_to_send(sent, wanted, SHARED) == {"J": 25_001}


def test_the_span_from_the_dev_clusters_scontrol_show_config() -> None:
    assert weight_span(CONFIG) == SPAN
    tres = CONFIG.replace(
        "PriorityWeightTRES      = (null)", "PriorityWeightTRES      = CPU=1000,Mem=2000.5,GRES/gpu=3000"
    )
    assert weight_span(tres) == SPAN + 1000 + 2000 + 3000  # 2000.5 rounds to 2000
    with pytest.raises(CommandError, match="PriorityWeightQOS = 'lots'"):
        weight_span(CONFIG.replace("PriorityWeightQOS       = 0", "PriorityWeightQOS       = lots"))


def test_bands_that_do_not_fit_the_site_factor_max_are_refused(tmp_path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "config.txt").write_text(CONFIG)
    scontrol = bin_dir / "scontrol"  # a stand-in printing the recorded configuration
    scontrol.write_text(f"#!/bin/sh\nexec cat {bin_dir / 'config.txt'}\n")
    scontrol.chmod(0o755)
    cmd = SlurmCommands(bin_dir=str(bin_dir))
    assert SiteReader(cmd, 1_000_000, 0.5).span() == SPAN
    with pytest.raises(InputError, match=r"order_share = 0.5.*up to 120004.*site_factor_max = 100000"):
        SiteReader(cmd, 100_000, 0.5).span()


@pytest.mark.parametrize("value", ["1.5", "-0.1", "nan", "inf", '"half"'])
def test_order_share_is_validated(tmp_path, value: str) -> None:
    with pytest.raises(ConfigError, match="order_share"):
        parse({"data_dir": str(tmp_path), "slurm": {"order_share": float(value) if value[0] != '"' else value[1:-1]}})
    assert parse({"data_dir": str(tmp_path)}).slurm.order_share == 0.5
    assert parse({"data_dir": str(tmp_path), "slurm": {"order_share": 0}}).slurm.order_share == 0.0


def test_the_knob_refuses_a_share_outside_0_to_1() -> None:
    for bad in (-0.01, 1.01, float("nan")):
        with pytest.raises(ValueError, match="share"):
            PriorityKnob(0, 10, share=bad)
    assert PriorityKnob(0, 10).share == 1.0  # the former rule by default
