"""Live remapping's pure parts: the RMS view (swaps of equal node counts only, no move onto nodes
the RMS has not given, home when the own node frees), the agent's placements, the farm file."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.observe import Observation
from agent.remap_step import placements
from plugins.oar.parse import nodes_from_resources as oar_nodes
from plugins.oar.parse import resources_from_data
from plugins.pbs.parse import parse_nodes as parse_pbs_nodes
from preemption.remap.farm import load_subclusters
from preemption.remap.live import (
    Placement,
    decide_swaps,
    homeward,
    job_subcluster,
    moves_for,
    node_subclusters,
    released,
    running_jobs,
    seen_memory,
)
from preemption.remap.models import Profile, SubCluster
from preemption.remap.online import CYCLES
from preemption.remap.policy import RemapParams
from vjob.errors import InputError
from vjob.model import ClusterView, Job, JobState, Node
from vjob.pilot_files import PilotState, PilotStatus
from vjob.store import journal
from vjob.store.db import Store

PAPER = Path(__file__).resolve().parents[1] / "docs" / "remap" / "arrive-f.toml"
FARM = {
    "slow": SubCluster("slow", 4, 1, 4096, 1.0, cycles={CYCLES: 1.0}),
    "fast": SubCluster("fast", 4, 1, 4096, 3.0, cycles={CYCLES: 1.0}),
}
PARAMS = RemapParams(beta=20, tau_s=50, threshold_s=10, max_migrations=2)


def _busy(share: float, ghz: float, window_s: float = 50.0) -> Profile:
    """A window of a VM using `share` of a vCPU on a node of `ghz` (CPU time as cycles)."""
    return Profile(window_s, counters={CYCLES: share * window_s * ghz * 1e9})


def _place(job: str, hosts: list[str], allocated: list[str] | None = None, **kw: object) -> Placement:
    vms = tuple((f"vm-{job}-{i}", h) for i, h in enumerate(hosts))
    return Placement(job, vms, tuple(allocated if allocated is not None else hosts), 512, **kw)  # type: ignore[arg-type]


NODE_SC = {"s1": "slow", "s2": "slow", "s3": "slow", "f1": "fast", "f2": "fast", "f3": "fast"}


def test_busy_job_on_slow_swaps_with_idle_job_on_fast_and_hosts_cross() -> None:
    places = [_place("1", ["s1"]), _place("2", ["f1"])]
    profiles = {"1": _busy(1.0, 1.0), "2": _busy(0.0, 3.0)}
    jobs = running_jobs(places, profiles, NODE_SC, FARM, PARAMS, 110.0)
    (d,) = decide_swaps(jobs, FARM, PARAMS)
    assert (d.kind, d.reason, set(d.jobs)) == ("swap", "gain", {"1", "2"})
    # busy: 50 s × (1 − 1/3) per window × β 20 − T^M (512 MB × 1.2 / 110); idle: 0 − T^M
    tm = 512 * 1.2 / 110
    assert d.gain_s == pytest.approx(50 * (2 / 3) * 20 - tm - tm)
    moves = moves_for([d], places)
    assert {(m.vm, m.src, m.dst) for m in moves} == {("vm-1-0", "s1", "f1"), ("vm-2-0", "f1", "s1")}


def test_the_migration_is_priced_with_the_memory_libvirt_holds_not_the_pilots_word() -> None:
    # Job 1's pilot declares 512 MB but libvirt holds 4,000 MiB for its VM: a swap would cost
    # it 43.6 s, and the gain no longer clears the threshold. A job libvirt gave no figure for is
    # left out (unpriced), with its reason.
    places = [_place("1", ["s1"]), _place("2", ["f1"]), _place("3", ["s2"])]
    priced, left = seen_memory(places, {"vm-1-0": 4000, "vm-2-0": 128})
    assert [(p.job, p.memory_mb) for p in priced] == [("1", 4000), ("2", 128)]
    assert set(left) == {"3"} and "not known from libvirt" in left["3"]
    profiles = {"1": _busy(0.05, 1.0), "2": _busy(0.0, 3.0)}
    declared = decide_swaps(running_jobs(places[:2], profiles, NODE_SC, FARM, PARAMS, 110.0), FARM, PARAMS)
    assert [d.kind for d in declared] == ["swap"]  # 33.3 − 2 × 5.6 s: over the 10 s threshold
    assert decide_swaps(running_jobs(priced, profiles, NODE_SC, FARM, PARAMS, 110.0), FARM, PARAMS) == []
    # The bigger memory also decides the fit: 4,000 MiB fits the 4,096 MiB of a fast slot, 5,000 does not.
    (big,) = running_jobs(seen_memory(places[:1], {"vm-1-0": 5000})[0], profiles, NODE_SC, FARM, PARAMS, 110.0)
    assert big.memory_mb_per_slot == 5000 and big.migrate_s == pytest.approx(5000 * 1.2 / 110)


def test_no_move_onto_idle_nodes_live_even_with_a_large_gain() -> None:
    # The fast sub-cluster is empty: the simulator would move job 1 there; live, the RMS does not
    # hold those nodes for it, so nothing happens.
    jobs = running_jobs([_place("1", ["s1"])], {"1": _busy(1.0, 1.0)}, NODE_SC, FARM, PARAMS, 110.0)
    assert jobs[0].gains["fast"] > 30
    assert decide_swaps(jobs, FARM, PARAMS) == []


def test_two_busy_jobs_never_swap() -> None:
    # Both CPU-bound: what one gains on fast the other loses three times over on slow.
    places = [_place("1", ["s1"]), _place("2", ["f1"])]
    profiles = {"1": _busy(1.0, 1.0), "2": _busy(1.0, 3.0)}
    assert decide_swaps(running_jobs(places, profiles, NODE_SC, FARM, PARAMS, 110.0), FARM, PARAMS) == []


def test_jobs_of_unknown_or_mixed_subclusters_are_left_alone() -> None:
    places = [_place("1", ["x9"]), _place("2", ["s1", "f1"]), _place("3", ["s2", "s3"])]
    assert [job_subcluster(p, NODE_SC) for p in places] == [None, None, "slow"]
    jobs = running_jobs(places, {}, NODE_SC, FARM, PARAMS, 110.0)
    assert [(j.id, j.cluster, j.slots) for j in jobs] == [("3", "slow", 2)]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 3), st.booleans(), st.floats(0, 1)),  # nodes, on fast, CPU share
        min_size=0,
        max_size=8,
    ),
    st.floats(-100, 500),
)
def test_every_live_decision_is_a_swap_of_equal_node_counts_over_the_threshold(
    specs: list[tuple[int, bool, float]], threshold: float
) -> None:
    params = RemapParams(beta=20, tau_s=50, threshold_s=threshold, max_migrations=2)
    free = {"slow": [f"s{i}" for i in range(30)], "fast": [f"f{i}" for i in range(30)]}
    node_sc = {n: sc for sc, ns in free.items() for n in ns}
    places, profiles = [], {}
    for i, (n, fast, share) in enumerate(specs):
        sc = "fast" if fast else "slow"
        hosts = [free[sc].pop() for _ in range(n)]
        places.append(_place(str(i), hosts))
        profiles[str(i)] = _busy(share, FARM[sc].freq_ghz)
    decisions = decide_swaps(running_jobs(places, profiles, node_sc, FARM, params, 110.0), FARM, params)
    size = {p.job: len(p.vms) for p in places}
    seen: set[str] = set()
    for d in decisions:
        assert d.kind == "swap" and d.gain_s > threshold
        assert size[d.jobs[0]] == size[d.jobs[1]]
        assert not seen & set(d.jobs)
        seen |= set(d.jobs)
    moves = moves_for(decisions, places)
    # After the moves every host still holds exactly one VM: nobody lands on a node the RMS gave nobody.
    where = {vm: h for p in places for vm, h in p.vms} | {m.vm: m.dst for m in moves}
    assert sorted(where.values()) == sorted(h for p in places for h in p.hosts)


def test_home_when_the_partner_ended_and_not_before() -> None:
    # Job 1 (allocated s1) runs on f1 after a swap with job 2 (allocated f1), whose VM is on s1.
    swapped = [_place("1", ["f1"], ["s1"]), _place("2", ["s1"], ["f1"])]
    assert homeward(swapped) == []
    (m,) = homeward(swapped[:1])  # job 2 ended: the RMS has freed f1
    assert (m.job, m.vm, m.src, m.dst, m.why) == ("1", "vm-1-0", "f1", "s1", "home")
    # The RMS already started job 4 on f1: all the more reason to leave it, whoever shares s1.
    (m,) = homeward([swapped[0], _place("4", ["f1"]), _place("3", ["s1"])])
    assert (m.vm, m.src, m.dst) == ("vm-1-0", "f1", "s1")
    # A chain: j1 on f1 (k's), k on f2 (n's), n on s1 (j1's); n ends: k goes home to f1, which
    # ends the lending of f1, so j1 goes home to s1 in the same call.
    chain = [_place("j1", ["f1"], ["s1"]), _place("k", ["f2"], ["f1"])]
    assert {(m.job, m.src, m.dst) for m in homeward(chain)} == {("k", "f2", "f1"), ("j1", "f1", "s1")}
    # Two swapped pairs, one partner ended: only its partner goes home.
    pairs = [*swapped, _place("5", ["f2"], ["s2"])]  # job 5's partner (allocated f2) ended
    (m,) = homeward(pairs)
    assert (m.job, m.src, m.dst) == ("5", "f2", "s2")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans()), max_size=10))
def test_after_the_home_moves_every_vm_is_on_its_own_node_or_a_lent_one(pairs: list[tuple[bool, bool, bool]]) -> None:
    # Pair i: job j{i} (allocated s{i}) swapped with k{i} (allocated f{i}); either may have
    # ended, and the RMS may have started a new job n{i} on a freed f{i}.
    places = []
    for i, (j_alive, k_alive, newcomer) in enumerate(pairs):
        if j_alive:
            places.append(_place(f"j{i}", [f"f{i}"], [f"s{i}"]))
        if k_alive:
            places.append(_place(f"k{i}", [f"s{i}"], [f"f{i}"]))
        elif newcomer:
            places.append(_place(f"n{i}", [f"f{i}"]))
    moves = homeward(places)
    alloc = {p.job: p.allocated for p in places}
    assert all(m.why == "home" and m.dst in alloc[m.job] for m in moves)
    moved = {m.vm: m.dst for m in moves}
    after = [
        Placement(p.job, tuple((vm, moved.get(vm, h)) for vm, h in p.vms), p.allocated, p.memory_mb) for p in places
    ]
    lent = {h for q in after for h in q.allocated if h not in q.hosts}
    for p in after:
        assert all(h in p.allocated or h in lent for h in p.hosts), p
    assert homeward(after) == []  # nothing left to do
    for i, (j_alive, k_alive, _n) in enumerate(pairs):  # a pair both alive never moves
        if j_alive and k_alive:
            assert not any(m.job in (f"j{i}", f"k{i}") for m in moves)


def test_an_ended_job_is_released_only_once_no_foreign_vm_runs_on_its_nodes() -> None:
    # 1 and 2 swapped (1 on f1, 2 on s1); 1 ended on f1, so its VM is gone; 2 still runs on s1, 1's node.
    away = [_place("2", ["s1"], ["f1"])]
    assert released({"1": ("s1",)}, away) == []  # the RMS would free s1 under 2's VM: hold on
    home = [_place("2", ["f1"], ["f1"])]
    assert released({"1": ("s1",)}, home) == ["1"]
    own = _place("3", ["s3"])  # an ended job's own VM (a stale placement) is no foreign one
    assert released({"1": ("s1",), "3": ("s3",)}, [*home, own]) == ["1", "3"]
    assert released({"1": ("s1", "s2")}, [_place("4", ["s2"], ["f2"])]) == []  # any of its nodes


def test_a_pilot_holds_its_node_only_where_remapping_is_on_and_the_bound_is_checked() -> None:
    from pilot.specs import partner_hold_s
    from vjob.config import parse
    from vjob.errors import ConfigError

    assert partner_hold_s(parse({})) == 0.0  # no remap step to release it: it would only wait
    assert partner_hold_s(parse({"remap": {"farm_file": "farm.toml"}})) == 25.0
    assert partner_hold_s(parse({"remap": {"farm_file": "farm.toml", "partner_hold_s": 3}})) == 3.0
    with pytest.raises(ConfigError, match=r"remap\.partner_hold_s = -1"):
        parse({"remap": {"partner_hold_s": -1}})


def test_home_ignores_the_migration_bound() -> None:
    (m,) = homeward([_place("1", ["f1"], ["s1"], migrations=5)])
    assert m.dst == "s1"


def _pilot(job: str, node: str, state: PilotState = PilotState.RUNNING) -> PilotStatus:
    return PilotStatus(job, f"vjob-slurm-{job}", node, "test:///default", state, time.time(), memory_mb=256)


def test_placements_trust_a_pilot_off_its_allocation_only_where_the_journal_moved_it() -> None:
    now = time.time()
    one = [
        Job(j, "u", rms="slurm", state=JobState.RUNNING, allocated_nodes=(alloc,), start_time=now - 100, walltime=w)
        for j, alloc, w in (("1", "s1", 1000.0), ("2", "f1", None), ("3", "f2", None), ("4", "s2", None))
    ]
    jobs = (*one, Job("5", "u", rms="slurm", nodes=2, state=JobState.RUNNING, allocated_nodes=("s3", "f3")))
    pilots = {
        "1": _pilot("1", "f1"),  # moved by the journal: trusted
        "2": _pilot("2", "s1"),
        "3": _pilot("3", "s2"),  # claims s2, nobody put it there: left out
        "4": _pilot("4", "s2", PilotState.SAVED),  # not running
        "5": _pilot("5", "s3"),  # several VMs: not migrated VM by VM
    }
    view = ClusterView(now=now, nodes=(Node("s1", 1, 4096, features=("slow",)),), jobs=jobs)
    obs = Observation(view, pilots, {}, True)
    moved = {"vjob-slurm-1": "f1", "vjob-slurm-2": "s1", "vjob-slurm-3": "f9"}
    out = {p.job: p for p in placements(obs, moved, {"1": 1, "2": 1})}
    assert set(out) == {"1", "2"}
    assert out["1"].vms == (("vjob-slurm-1", "f1"),) and out["1"].allocated == ("s1",)
    assert out["1"].migrations == 1 and out["1"].memory_mb == 256
    assert out["1"].remaining_s == pytest.approx(900, abs=5) and out["2"].remaining_s is None


def test_node_subclusters_from_rms_features() -> None:
    nodes = [Node("a", 1, 1024, features=("ib", "fast")), Node("b", 1, 1024, features=("slow",)), Node("c", 1, 1)]
    assert node_subclusters(nodes, FARM) == {"a": "fast", "b": "slow"}


def test_farm_file_for_the_agent_reads_the_paper_farm_and_ignores_kinds() -> None:
    farm = load_subclusters(PAPER)
    assert sorted(farm) == ["A", "B", "C", "D"] and farm["B"].freq_ghz == 3.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "subcluster"),
        (
            '[[subcluster]]\nname = "a b"\nnodes = 1\ncores_per_node = 1\nmemory_mb_per_node = 1\nfreq_ghz = 1.0\n',
            r"subcluster\[0\]\.name = .a b.",
        ),
        (
            '[[subcluster]]\nname = "a"\nnodes = 1\ncores_per_node = 1\nmemory_mb_per_node = 1\nfreq_ghz = 0\n',
            "freq_ghz",
        ),
        ("[[subcluster]\n", "farm.toml"),
    ],
)
def test_bad_farm_file_is_an_error_naming_the_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "farm.toml"
    path.write_text(text)
    with pytest.raises(InputError, match=message) as err:
        load_subclusters(path)
    assert "farm_file" in str(err.value) or "farm.toml" in str(err.value)


def test_missing_farm_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"\[remap\] farm_file .*nope.toml: cannot read"):
        load_subclusters(tmp_path / "nope.toml")


# -- node kinds from the RMS ------------------------------------------------------------------


def test_torque_properties_of_a_recorded_pbsnodes_name_the_subclusters(shared_dir: Path) -> None:
    # VSC's thinking cluster: 144 haswell nodes and 5 K40c GPU nodes (also "haswell", after
    # their type_K40c): each node's first property naming a sub-cluster of the farm is its kind.
    path = shared_dir / "data" / "fixtures" / "torque" / "vsc_pbsnodes_thinking.txt"
    nodes = parse_pbs_nodes(path.read_text(errors="replace"), source=str(path))
    farm = {name: SubCluster(name, 1, 1, 1024, 2.5) for name in ("type_haswell", "type_K40c")}
    kinds = node_subclusters(nodes, farm)
    assert Counter(kinds.values()) == {"type_haswell": 144, "type_K40c": 5}
    assert kinds["r10n5"] == "type_K40c" and len(kinds) == len(nodes)


def test_openpbs_boolean_resources_name_the_subcluster() -> None:
    # OpenPBS has no node properties: a site marks a node kind with a boolean custom resource.
    text = (
        "n1\n     state = free\n     pcpus = 8\n     resources_available.ncpus = 8\n"
        "     resources_available.mem = 16gb\n     resources_available.phenom = True\n"
        "     resources_available.arch = linux\n\n"
        "n2\n     state = free\n     pcpus = 8\n     resources_available.ncpus = 8\n"
        "     resources_available.opteron = True\n     resources_available.bigmem = False\n"
    )
    nodes = parse_pbs_nodes(text, source="pbsnodes -av")
    farm = {name: SubCluster(name, 1, 1, 1024, 2.5) for name in ("phenom", "opteron")}
    assert node_subclusters(nodes, farm) == {"n1": "phenom", "n2": "opteron"}


def test_oar_cluster_property_is_the_node_kind() -> None:
    # `oarnodes -J`: one resource per core, each with the OAR `cluster` property of its host.
    res = {
        str(i): {"resource_id": i, "network_address": host, "state": "Alive", "cluster": cl, "site": "grenoble"}
        for i, (host, cl) in enumerate((("d1", "dahu"), ("d1", "dahu"), ("y1", "yeti"), ("x1", "")), start=1)
    }
    nodes = oar_nodes(resources_from_data(res, source="oarnodes -J"))
    assert {n.name: n.features for n in nodes} == {"d1": ("dahu",), "x1": (), "y1": ("yeti",)}
    farm = {name: SubCluster(name, 1, 1, 1024, 2.5) for name in ("dahu", "yeti")}
    assert node_subclusters(nodes, farm) == {"d1": "dahu", "y1": "yeti"}


def test_the_journal_counts_done_migrations_per_job_of_one_rms_only(store: Store) -> None:
    planned = [
        journal.PlannedAction(0, "migrate", "vm-a", "slurm:1", "s1", "f1"),
        journal.PlannedAction(0, "migrate", "vm-b", "slurm:2", "f1", "s1"),
        journal.PlannedAction(0, "migrate", "vm-c", "pbs:1", "s1", "f1"),
        journal.PlannedAction(0, "suspend", "vm-a", "slurm:1", "f1", None),
        journal.PlannedAction(0, "migrate", "vm-a", "slurm:1", "f1", "s2"),
    ]
    _sw, ids = journal.open_switch(store, "remap: test", {}, planned)
    for i in ids[:4]:
        journal.set_action(store, i, "done")
    journal.set_action(store, ids[4], "failed", "refused")
    every = journal.migrations(store, "slurm")
    assert [(m.rms_job_id, m.vm_name, m.destination) for m in every] == [("1", "vm-a", "f1"), ("2", "vm-b", "s1")]
    assert journal.migrations(store, "slurm", ["2", "3"], chunk=1) == every[1:]
    assert journal.migrations(store, "slurm", []) == []
