"""The engine on hand-checkable traces, and invariants every simulated schedule must satisfy."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.engine import Simulation, simulate
from simulator.lublin import generate
from simulator.replay import ClusterModel, Result
from simulator.setup import UbisSetup, apply
from simulator.workload import Workload
from vjob.config import PriorityConfig
from vjob.errors import InputError


def jobs(rows: list[tuple[float, float, int]], interactive: list[bool] | None = None, os: list[int] | None = None):
    """A workload from (submit, runtime, nodes) rows; perfect estimates, OS image 0."""
    n = len(rows)
    return Workload.from_columns(
        {
            "submit": [r[0] for r in rows],
            "runtime": [r[1] for r in rows],
            "nodes": [r[2] for r in rows],
            "interactive": interactive or [False] * n,
            "os": os or [0] * n,
        }
    )


def starts(result: Result) -> list[float]:
    return result.first_start.tolist()


def one_os(nodes: int, **kw) -> ClusterModel:
    return ClusterModel(nodes=nodes, os_count=1, **kw)


def test_easy_backfills_only_what_does_not_delay_the_reservation():
    # A holds 2 of 4 nodes until 100; B (4 nodes) is the head: reserved at 100.
    # C (2 nodes, 200 s) would push B back, so it waits; D (2 nodes, 90 s) ends at 93: backfilled.
    w = jobs([(0, 100, 2), (1, 50, 4), (2, 200, 2), (3, 90, 2)])
    r = simulate(w, one_os(4), "fcfs-easy")
    assert starts(r) == [0, 100, 150, 3]
    assert r.end.tolist() == [100, 150, 350, 93]


def test_easy_uses_extra_nodes_past_the_shadow_time():
    # 6 nodes: A (4 nodes) to 100; head B needs 4 at 100 → 2 extra nodes then; C (2 nodes,
    # 500 s) fits in the extra nodes, so it starts at once even though it outlasts the shadow.
    w = jobs([(0, 100, 4), (1, 50, 4), (2, 500, 2)])
    r = simulate(w, one_os(6), "fcfs-easy")
    assert starts(r) == [0, 100, 2]


def test_mms_interactive_waits_exactly_until_enough_nodes_are_free():
    # X holds all 4 nodes until 1000; the interactive job (2 nodes) arrives at 10 and gets the
    # reservation ahead of the earlier batch job Y (4 nodes): it starts at 1000, Y after it.
    w = jobs([(0, 1000, 4), (5, 100, 4), (10, 600, 2)], interactive=[False, False, True])
    r = simulate(w, one_os(4), "mms", PriorityConfig(interactive_cap=1.0))
    assert starts(r) == [0, 1600, 1000]
    assert r.preemptions == 0
    # fcfs-easy keeps submission order: the interactive job waits for Y too.
    r = simulate(w, one_os(4), "fcfs-easy", PriorityConfig(interactive_cap=1.0))
    assert starts(r) == [0, 1000, 1100]


def test_mms_block_backfills_nothing_while_an_interactive_job_waits():
    # X holds 2 of 4 nodes until 1000; the interactive job needs all 4 and is reserved at 1000.
    # B (2 nodes, 100 s) ends long before: mms backfills it at 20, mms-block holds it back.
    w = jobs([(0, 1000, 2), (10, 300, 4), (20, 100, 2)], interactive=[False, True, False])
    cfg = PriorityConfig(interactive_cap=1.0)
    assert starts(simulate(w, one_os(4), "mms", cfg)) == [0, 1000, 20]
    assert starts(simulate(w, one_os(4), "mms-block", cfg)) == [0, 1000, 1300]


def test_ubis_preempts_the_lowest_priority_batch_job_and_starts_after_its_checkpoint():
    # X and Y (2 nodes each) fill 4 nodes; Y queued later, so its queue-time term is smaller:
    # it is the lowest-priority job. The interactive job (2 nodes) at 100 checkpoints Y:
    # 4096 MB at 512 MB/s = 8 s, so it starts at 108. Y resumes on its own nodes when they
    # are free again (local resume: 8 s to read back) and finishes its remaining work.
    model = one_os(4, bandwidth_mb_s=512.0, memory_mb_per_node=4096)
    w = jobs([(0, 1000, 2), (50, 1000, 2), (100, 300, 2)], interactive=[False, False, True])
    r = simulate(w, model, "ubis", PriorityConfig(interactive_cap=1.0))
    assert r.preemptions == 1
    assert r.preempt_count.tolist() == [0, 1, 0]
    assert r.first_start[2] == 108
    assert r.end[2] == 408
    # Y ran 50..100 (50 s done, 950 left), resumes at 408 with 8 s of restart: ends at 1366.
    assert r.end[1] == 408 + 8 + 950
    assert r.overhead_s.tolist() == [0, 16, 0]
    assert r.remote_resumes == 0
    y_segments = sorted((s, e) for j, s, e, _ in r.segments if j == 1)
    assert y_segments == [(50, 108), (408, 1366)]


def test_batch_never_preempts_batch_and_interactive_beyond_the_cap_waits():
    model = one_os(4)
    w = jobs([(0, 1000, 4), (10, 100, 2)], interactive=[False, False])
    r = simulate(w, model, "ubis")
    assert r.preemptions == 0 and r.first_start[1] == 1000
    # cap 0.25 of 4 nodes = 1 node: a 2-node interactive job is an ordinary job, no preemption.
    w = jobs([(0, 1000, 4), (10, 100, 2)], interactive=[False, True])
    r = simulate(w, model, "ubis", PriorityConfig(interactive_cap=0.25))
    assert r.preemptions == 0 and r.first_start[1] == 1000
    assert not r.ran_privileged[1]


def test_os_swap_costs_provisioning_time():
    # 2 nodes, images 0 and 1 (one each); a 2-node job on image 1 needs one node switched.
    model = ClusterModel(nodes=2, os_count=2, os_swap_s=120.0)
    r = simulate(jobs([(0, 100, 2)], os=[1]), model, "fcfs-easy")
    assert r.os_swaps == 1
    assert r.end[0] == 220 and r.overhead_s[0] == 120


def test_a_job_larger_than_the_machine_is_refused_with_its_id():
    with pytest.raises(InputError, match="job 2 asks for 9 nodes, the machine has 8"):
        simulate(jobs([(0, 10, 1), (1, 10, 9)]), one_os(8), "fcfs-easy")
    with pytest.raises(InputError, match="--policy = 'sjf'"):
        simulate(jobs([(0, 10, 1)]), one_os(8), "sjf")


# -- invariants on realistic schedules ------------------------------------------------------
NODES = 128
CAP = 0.15


@pytest.fixture(scope="module")
def workload() -> Workload:
    base = generate(NODES, 1200, seed=7, load=0.9)
    return apply(base, NODES, UbisSetup(interactive_frac=0.2, interactive_mean_size=12, seed=7))


@pytest.fixture(scope="module", params=["fcfs-easy", "mms", "ubis"])
def run(request: pytest.FixtureRequest, workload: Workload) -> Result:
    return simulate(workload, ClusterModel(nodes=NODES), request.param, PriorityConfig(interactive_cap=CAP))


def test_every_job_finishes_after_it_was_submitted(run: Result):
    w = run.workload
    assert not np.isnan(run.end).any()
    assert (run.first_start >= w.submit).all()
    for j, start, end, _ in run.segments:
        assert start >= w.submit[j] and end > start


def test_never_more_nodes_busy_than_exist(run: Result):
    points = sorted([(s, n) for _, s, _, n in run.segments] + [(e, -n) for _, _, e, n in run.segments])
    busy = 0
    # ends before starts at the same instant: a node freed at t may be reused at t
    for _, delta in sorted(points, key=lambda p: (p[0], p[1])):
        busy += delta
        assert busy <= NODES


def test_segments_add_up_to_runtime_plus_overheads(run: Result):
    w = run.workload
    total = np.zeros(len(w))
    count = np.zeros(len(w), dtype=int)
    for j, s, e, _ in run.segments:
        total[j] += e - s
        count[j] += 1
    np.testing.assert_allclose(total, w.runtime + run.overhead_s, rtol=0, atol=1e-6)
    assert (count == run.preempt_count + 1).all()


def test_interactive_cap_holds(run: Result):
    assert run.max_interactive_held <= CAP * NODES
    w = run.workload
    assert not run.ran_privileged[~w.interactive].any()


def test_only_ubis_preempts_and_only_batch_jobs(run: Result):
    w = run.workload
    if run.policy != "ubis":
        assert run.preemptions == 0
    else:
        assert run.preemptions > 0
    assert (run.preempt_count[w.interactive] == 0).all()


@pytest.mark.parametrize("depth", [3, 40, None])
def test_exact_ubis_passes_equal_ranking_the_whole_queue(
    workload: Workload, depth: int | None, monkeypatch: pytest.MonkeyPatch
):
    """The exact ubis pass ranks only the jobs it can act on (ubis_priority.compiled); with
    a refresh period shorter than any gap between passes the engine instead ranks the whole
    queue at every pass (policies.ubis_order over all priorities). Both must give the same
    schedule, also when the backfill depth cuts the window (3: nearly always). One share
    entity, so the extra usage decays of the full ranking cannot move a usage share."""
    prio = PriorityConfig(interactive_cap=CAP)
    exact = simulate(workload, ClusterModel(nodes=NODES, backfill_depth=depth), "ubis", prio)
    full = simulate(workload, ClusterModel(nodes=NODES, backfill_depth=depth, priority_refresh_s=1e-9), "ubis", prio)
    # and with the engine's switch to whole-queue ranking for long queues taken at 20 jobs
    monkeypatch.setattr("simulator.engine_pass.FULL_RANK_ABOVE", 20)
    switched = simulate(workload, ClusterModel(nodes=NODES, backfill_depth=depth), "ubis", prio)
    assert exact.preemptions > 0
    for other in (full, switched):
        np.testing.assert_array_equal(exact.first_start, other.first_start)
        np.testing.assert_array_equal(exact.end, other.end)
        assert exact.segments == other.segments


def test_take_nodes_prefers_the_previous_nodes_then_the_jobs_image():
    from simulator.node_pool import FREE, take_nodes

    owner = np.full(6, FREE, dtype=np.int64)
    node_os = np.array([0, 1, 0, 1, 0, 1], dtype=np.int64)
    free_by_os = np.bincount(node_os, minlength=2)
    # a first start: image-1 nodes first (lowest index first), then the others, which switch
    nodes, local, swaps = take_nodes(owner, node_os, free_by_os, 7, 1, 4, np.empty(0, dtype=np.int64))
    assert nodes.tolist() == [1, 3, 5, 0] and not local and swaps == 1
    assert owner.tolist() == [7, 7, FREE, 7, FREE, 7]
    assert node_os.tolist() == [1, 1, 0, 1, 0, 1] and free_by_os.tolist() == [2, 0]
    # a resume whose previous nodes are all free gets them back (locally), whatever their image
    nodes, local, swaps = take_nodes(owner, node_os, free_by_os, 8, 1, 2, np.array([4, 2], dtype=np.int64))
    assert nodes.tolist() == [4, 2] and local and swaps == 2
    assert free_by_os.tolist() == [0, 0]


def _two_users(accounts: list[int] | None = None) -> Workload:
    """40 one-node-at-a-time jobs on a 1-node machine, users 0 and 1 in turn, all queued at 0:
    who goes first is decided by the Target - Usage term alone (ties: submission order)."""
    n = 40
    cols: dict[str, list[float] | np.ndarray] = {
        "submit": [0.0] * n,
        "runtime": [100.0] * n,
        "nodes": [1] * n,
        "user": [k % 2 for k in range(n)],
        "os": [0] * n,
    }
    if accounts is not None:
        cols["account"] = [accounts[k % 2] for k in range(n)]
    return Workload.from_columns(cols)


def _mean_start(result: Result, user: int) -> float:
    w = result.workload
    return float(result.first_start[w.user == user].mean())


def test_the_simulator_honours_user_targets():
    """[priority] targets names a trace's users by their id: user 1 with a 0.9 target gets the
    higher Target - Usage term, so its jobs start earlier than with the equal 1/n split."""
    equal = simulate(_two_users(), one_os(1), "ubis", PriorityConfig())
    targeted = simulate(_two_users(), one_os(1), "ubis", PriorityConfig(targets={"1": 0.9}))
    assert _mean_start(targeted, 1) < _mean_start(equal, 1)
    assert _mean_start(targeted, 0) > _mean_start(equal, 0)
    # With 1/n, usage alternates the two users; with the target, user 1 runs most jobs first.
    first_ten = targeted.workload.user[np.argsort(targeted.first_start, kind="stable")[:10]]
    assert int((first_ten == 1).sum()) >= 8


def test_the_simulator_honours_account_targets():
    """`account_targets` names a trace's accounts (Workload.account, the SWF group) by id."""
    equal = simulate(_two_users([5, 7]), one_os(1), "ubis", PriorityConfig())
    targeted = simulate(_two_users([5, 7]), one_os(1), "ubis", PriorityConfig(account_targets={"7": 0.9}))
    assert _mean_start(targeted, 1) < _mean_start(equal, 1)


def test_no_targets_is_the_equal_split():
    """Without targets every user's share is 1/n, to the bit, as before targets were honoured
    (the schedules of earlier versions stay the same)."""
    sim = Simulation(_two_users(), one_os(1), "ubis", PriorityConfig())
    assert sim.ledger.target.tolist() == [0.5, 0.5]
    sim = Simulation(_two_users(), one_os(1), "ubis", PriorityConfig(targets={"0": 0.2}))
    assert sim.ledger.target.tolist() == [0.2, 0.8]
