"""Remapping and the vjob policy pass in one tick: neither touches what the other acts on."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from preemption.remap.claims import PassClaims, allowed_moves, claims, remappable, remapped
from preemption.remap.live import Placement, decide_swaps, homeward, moves_for, running_jobs
from preemption.remap.models import Profile, SubCluster
from preemption.remap.online import CYCLES
from preemption.remap.policy import RemapParams
from preemption.scheduling.tick import Preemption

FARM = {
    "slow": SubCluster("slow", 4, 1, 4096, 1.0, cycles={CYCLES: 1.0}),
    "fast": SubCluster("fast", 4, 1, 4096, 3.0, cycles={CYCLES: 1.0}),
}
NODE_SC = {"s1": "slow", "s2": "slow", "s3": "slow", "f1": "fast", "f2": "fast", "f3": "fast"}
PARAMS = RemapParams(beta=20, tau_s=50, threshold_s=10, max_migrations=2)


def _place(job: str, host: str, allocated: str | None = None) -> Placement:
    return Placement(job, ((f"vm-{job}", host),), (allocated or host,), 512)


def _busy(ghz: float) -> Profile:
    return Profile(50, counters={CYCLES: 50 * ghz * 1e9})


def _idle() -> Profile:
    return Profile(50, counters={CYCLES: 1e6})


def test_claims_of_a_decision_are_its_victims_and_every_node_it_gives() -> None:
    pre = Preemption("int1", victims=("v1", "v2"), nodes=("s1", "s2"), checkpoint_bytes=0.0)
    c = claims([pre], {"int1": ("s1", "s2"), "b7": ("f3",)})
    assert c == PassClaims(frozenset({"v1", "v2"}), frozenset({"s1", "s2", "f3"}))


def test_a_victim_and_a_job_on_a_given_node_are_never_swapped() -> None:
    """Two busy-slow / idle-fast pairs would swap; the pass suspends busy a and gives idle d's
    node away: both are left out, with their reasons, and the untouched b and c pair up."""
    places = [_place("a", "s1"), _place("b", "f1"), _place("c", "s2"), _place("d", "f2")]
    profiles = {"a": _busy(1.0), "b": _idle(), "c": _busy(1.0), "d": _idle()}
    everyone = decide_swaps(running_jobs(places, profiles, NODE_SC, FARM, PARAMS, 110.0), FARM, PARAMS)
    assert len(everyone) == 2 and {j for d in everyone for j in d.jobs} == {"a", "b", "c", "d"}
    c = PassClaims(suspending=frozenset({"a"}), given=frozenset({"f2"}))
    keep, skipped = remappable(places, c)
    assert [p.job for p in keep] == ["b", "c"]
    assert skipped == {
        "a": "the vjob policy suspends it this tick",
        "d": "the vjob policy gives its node(s) f2 to another job this tick",
    }
    left = decide_swaps(running_jobs(keep, profiles, NODE_SC, FARM, PARAMS, 110.0), FARM, PARAMS)
    assert [set(d.jobs) for d in left] == [{"b", "c"}]


def test_a_home_move_leaves_a_given_node_but_never_goes_to_one() -> None:
    # j was swapped onto f1; its partner ended and the pass now gives f1 to a new job: j goes home
    j = _place("j", "f1", allocated="s1")
    home = homeward([j])
    assert [(m.src, m.dst) for m in home] == [("f1", "s1")]
    keep, dropped = allowed_moves(home, PassClaims(given=frozenset({"f1"})))
    assert keep == home and dropped == []
    keep, dropped = allowed_moves(home, PassClaims(given=frozenset({"s1"})))
    assert keep == [] and dropped[0][1] == "the vjob policy gives s1 to another job this tick"
    keep, dropped = allowed_moves(home, PassClaims(suspending=frozenset({"j"})))
    assert keep == [] and dropped[0][1] == "the vjob policy suspends it this tick"


def test_remapped_jobs_are_no_victims_for_the_pass() -> None:
    places = [_place("j", "f1", allocated="s1"), _place("k", "s1", allocated="f1"), _place("h", "s2")]
    assert remapped(places) == {"j", "k"}
    # the partner k ended: j is still away (its own s1 is free), so it stays no victim until home
    assert remapped([_place("j", "f1", allocated="s1"), _place("h", "s2")]) == {"j"}
    # a job at home whose own node another's VM occupies (a node lent by it): no victim either
    assert remapped([_place("h", "s2"), Placement("x", (("vm-x", "s2"),), ("f3",), 512)]) >= {"h", "x"}


@st.composite
def ticks(draw: st.DrawFn) -> tuple[list[Placement], dict[str, Profile], PassClaims]:
    nodes = sorted(NODE_SC)
    hosts = draw(st.permutations(nodes))
    n = draw(st.integers(0, len(nodes)))
    places, profiles = [], {}
    for i in range(n):
        own = hosts[i]
        away = draw(st.booleans())
        host = hosts[(i + 1) % n] if away and n > 1 else own
        places.append(Placement(f"j{i}", ((f"vm{i}", host),), (own,), 512))
        profiles[f"j{i}"] = draw(st.sampled_from([_busy(1.0), _busy(3.0), _idle()]))
    # one VM per host: keep the first VM claiming a host
    seen: set[str] = set()
    unique = []
    for p in places:
        if p.hosts[0] not in seen:
            seen.add(p.hosts[0])
            unique.append(p)
    jobs = [p.job for p in unique]
    c = PassClaims(
        frozenset(draw(st.lists(st.sampled_from(jobs), max_size=3)) if jobs else []),
        frozenset(draw(st.lists(st.sampled_from(nodes), max_size=3))),
    )
    return unique, profiles, c


@settings(max_examples=300, deadline=None)
@given(ticks())
def test_no_move_of_a_tick_touches_what_the_pass_claims(
    case: tuple[list[Placement], dict[str, Profile], PassClaims],
) -> None:
    """Over random ticks: no VM moved belongs to a vjob the pass suspends, none lands on a node
    it gives away, and a swap never involves a VM on, or an allocation with, a given node."""
    places, profiles, c = case
    home, _ = allowed_moves(homeward(places), c)
    keep, skipped = remappable(places, c)
    swaps = moves_for(decide_swaps(running_jobs(keep, profiles, NODE_SC, FARM, PARAMS, 110.0), FARM, PARAMS), keep)
    for m in home + swaps:
        assert m.job not in c.suspending and m.dst not in c.given
    for m in swaps:
        assert m.src not in c.given
    assert set(skipped) | {p.job for p in keep} == {p.job for p in places}
    assert all(p.job in skipped for p in places if p.job in c.suspending)
