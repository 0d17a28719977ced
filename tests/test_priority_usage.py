"""Usage and targets in the real state store (SQLite and PostgreSQL)."""

from __future__ import annotations

import threading

import pytest

from ubis_priority import compute
from ubis_priority.usage import charge, decayed, load_targets, load_usage, sync_targets, with_history
from vjob.config import PriorityConfig
from vjob.errors import InputError
from vjob.model import ClusterView, Job, JobState, Node
from vjob.store.db import Store

DAY = 86400.0
CFG = PriorityConfig(usage_half_life_s=DAY)
NODES = tuple(Node(f"n{i}", 8, 16384) for i in range(4))


def _running(job_id: str, user: str, start: float, nodes: int = 2, account: str = "") -> Job:
    return Job(
        job_id,
        user,
        account=account,
        nodes=nodes,
        state=JobState.RUNNING,
        start_time=start,
        allocated_nodes=tuple(f"n{i}" for i in range(nodes)),
    )


def test_decay_halves_per_half_life_and_never_grows():
    assert decayed(100.0, DAY, DAY) == pytest.approx(50.0)
    assert decayed(100.0, 3 * DAY, DAY) == pytest.approx(12.5)
    assert decayed(100.0, -5.0, DAY) == 100.0
    with pytest.raises(InputError, match="half-life"):
        decayed(1.0, 1.0, 0.0)


def test_charging_counts_node_seconds_since_the_last_charge(store):
    t0 = 1_000_000.0
    first = ClusterView(now=t0 + 100, nodes=NODES, jobs=(_running("j1", "alice", t0, account="phys"),))
    assert charge(store, first, CFG) == {("user", "alice"): 200.0, ("account", "phys"): 200.0}
    # The same observation again charges nothing: an agent restarted mid-cycle does not double count.
    assert charge(store, first, CFG) == {}
    later = ClusterView(now=t0 + 400, nodes=NODES, jobs=(_running("j1", "alice", t0, account="phys"),))
    assert charge(store, later, CFG) == {("user", "alice"): 600.0, ("account", "phys"): 600.0}
    usage = load_usage(store, t0 + 400, CFG)
    assert usage["alice"] == pytest.approx(decayed(200.0, 300.0, DAY) + 600.0)
    assert load_usage(store, t0 + 400, CFG, kind="account")["phys"] == pytest.approx(usage["alice"])


def test_a_job_that_finished_between_two_charges_is_charged_up_to_its_end(store):
    t0 = 2_000_000.0
    charge(store, ClusterView(now=t0, nodes=NODES, jobs=(_running("j1", "bob", t0 - 10, nodes=1),)), CFG)
    done = Job("j1", "bob", nodes=1, state=JobState.COMPLETED, start_time=t0 - 10, end_time=t0 + 50)
    pending = Job("j2", "bob", nodes=4)
    charged = charge(store, ClusterView(now=t0 + 500, nodes=NODES, jobs=(done, pending)), CFG)
    assert charged == {("user", "bob"): 50.0}


def test_usage_decays_between_reads(store):
    t0 = 3_000_000.0
    charge(store, ClusterView(now=t0, nodes=NODES, jobs=(_running("j", "carol", t0 - 1000),)), CFG)
    assert load_usage(store, t0 + DAY, CFG)["carol"] == pytest.approx(1000.0)  # 2 nodes × 1000 s, halved


def test_targets_follow_the_configuration(store):
    sync_targets(store, PriorityConfig(targets={"alice": 0.5, "bob": 0.2}, account_targets={"phys": 0.3}))
    assert load_targets(store) == {"alice": 0.5, "bob": 0.2}
    assert load_targets(store, kind="account") == {"phys": 0.3}
    sync_targets(store, PriorityConfig(targets={"bob": 0.4}))
    assert load_targets(store) == {"bob": 0.4}
    assert load_targets(store, kind="account") == {}


def test_a_heavy_user_gets_a_lower_usage_term_than_a_light_one(store):
    t0 = 4_000_000.0
    heavy = _running("h", "heavy", t0 - 3600, nodes=4)
    charge(store, ClusterView(now=t0, nodes=NODES, jobs=(heavy,)), CFG)
    sync_targets(store, PriorityConfig(targets={"heavy": 0.5, "light": 0.5}))
    pending = (Job("a", "heavy", submit_time=t0), Job("b", "light", submit_time=t0))
    view = with_history(ClusterView(now=t0, nodes=NODES, jobs=pending), store, CFG)
    assert view.targets == {"heavy": 0.5, "light": 0.5}
    prios = compute(view, CFG)
    assert prios.explain("a").terms[0].raw == pytest.approx(-0.5)
    assert prios.explain("b").terms[0].raw == pytest.approx(0.5)
    assert prios.as_dict()["b"] > prios.as_dict()["a"]


def test_two_agents_charging_the_same_observation_at_once_charge_it_once(store):
    """Two agents (two engines) race on one observation of 2,000 users' jobs (enough rows for
    the two transactions to overlap): the lock lets exactly one of them charge it."""
    t0 = 5_000_000.0
    jobs = tuple(_running(f"j{i}", f"user{i}", t0 - 100, nodes=1) for i in range(2000))
    charge(store, ClusterView(now=t0, nodes=NODES, jobs=jobs), CFG)
    view = ClusterView(now=t0 + 1000, nodes=NODES, jobs=jobs)
    other = Store(store.url)
    results: list[dict] = []
    barrier = threading.Barrier(2)

    def agent(s: Store) -> None:
        barrier.wait()
        results.append(charge(s, view, CFG))

    threads = [threading.Thread(target=agent, args=(s,)) for s in (store, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    other.close()
    assert sorted(len(r) for r in results) == [0, 2000]
    expected = decayed(100.0, 1000.0, DAY) + 1000.0
    assert load_usage(store, t0 + 1000, CFG)["user7"] == pytest.approx(expected)
