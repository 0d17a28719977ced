"""ubis_priority.usage.charge writes its rows in one executemany: the stored figures must be
exactly (==, not approx) those of the rule it replaced — every row decayed to the charge's
instant by `decayed`, this charge's node-seconds added, new users inserted — on SQLite and
PostgreSQL."""

from __future__ import annotations

import random

from sqlalchemy import select

from ubis_priority import usage
from ubis_priority.usage import charge, decayed, load_usage
from vjob.config import PriorityConfig
from vjob.model import ClusterView, Job, JobState, Node
from vjob.store.db import Store
from vjob.store.schema import UsageRecord

CFG = PriorityConfig(usage_half_life_s=7 * 86400.0)
NODES = tuple(Node(f"n{i}", 8, 16384) for i in range(4))
T0 = 1_700_000_000.0


def _jobs(rnd: random.Random, now: float, users: int) -> tuple[Job, ...]:
    """Running, finished and pending jobs of `users` users and a few accounts, seeded."""
    out = []
    for i in range(300):
        user, account = f"u{rnd.randrange(users)}", rnd.choice(["", "phys", "chem", "bio"])
        start = now - rnd.uniform(0, 5000)
        kind = rnd.random()
        if kind < 0.6:
            out.append(
                Job(f"j{i}", user, account=account, nodes=rnd.randint(1, 4), state=JobState.RUNNING, start_time=start)
            )
        elif kind < 0.8:
            end = start + rnd.uniform(0, 4000)
            out.append(
                Job(f"j{i}", user, account=account, nodes=2, state=JobState.COMPLETED, start_time=start, end_time=end)
            )
        else:
            out.append(Job(f"j{i}", user, account=account, nodes=1))
    return tuple(out)


def _expected(model: dict[tuple[str, str], tuple[float, float]], view: ClusterView) -> None:
    """The rule, spelt out on a dict: {(kind, name): (node_seconds, decayed_at)}."""
    last = max((at for _ns, at in model.values()), default=None)
    if last is not None and view.now <= last:
        return
    amounts = usage._consumed(view, last)
    for key, (ns, at) in list(model.items()):
        model[key] = (decayed(ns, view.now - at, CFG.usage_half_life_s) + amounts.pop(key, 0.0), view.now)
    for key, ns in amounts.items():
        model[key] = (ns, view.now)


def _stored(store: Store) -> dict[tuple[str, str], tuple[float, float]]:
    with store.session() as s:
        rows = s.execute(
            select(UsageRecord.entity_kind, UsageRecord.name, UsageRecord.node_seconds, UsageRecord.decayed_at)
        ).all()
    return {(kind, name): (ns, at) for kind, name, ns, at in rows}


def _run(store: Store, seed: int) -> dict[tuple[str, str], tuple[float, float]]:
    rnd = random.Random(seed)
    model: dict[tuple[str, str], tuple[float, float]] = {}
    now = T0
    for step in range(12):
        now += rnd.choice([0.0, 30.0, 61.5, 3600.0])  # 0: the same instant again charges nothing
        view = ClusterView(now=now, nodes=NODES, jobs=_jobs(rnd, now, users=5 + 4 * step))
        _expected(model, view)
        charge(store, view, CFG)
        assert _stored(store) == model, f"step {step}"
    return model


def test_the_stored_figures_are_exactly_the_rules(store):
    model = _run(store, seed=14)
    assert len(model) > 40  # users appeared along the way and were inserted
    users = load_usage(store, T0 + 10**6, CFG)
    assert users == {
        name: decayed(ns, T0 + 10**6 - at, CFG.usage_half_life_s)
        for (kind, name), (ns, at) in model.items()
        if kind == "user"
    }


def test_a_user_without_new_usage_still_decays_and_moves_the_marker(store):
    old = Job("a", "idle", nodes=2, state=JobState.COMPLETED, start_time=T0 - 100, end_time=T0)
    charge(store, ClusterView(now=T0, nodes=NODES, jobs=(old,)), CFG)
    busy = Job("b", "busy", nodes=1, state=JobState.RUNNING, start_time=T0)
    charge(store, ClusterView(now=T0 + 600, nodes=NODES, jobs=(old, busy)), CFG)
    rows = _stored(store)
    assert rows[("user", "idle")] == (decayed(200.0, 600.0, CFG.usage_half_life_s), T0 + 600)
    assert rows[("user", "busy")] == (600.0, T0 + 600)
    assert charge(store, ClusterView(now=T0 + 600, nodes=NODES, jobs=(old, busy)), CFG) == {}
