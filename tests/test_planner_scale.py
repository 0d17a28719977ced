"""The planner at scale: the time limit is a wall-clock budget for the whole `vjob plan` command,
a first viable placement comes from fast packing heuristics, `--start` hands in a known placement.

The instances here come from their own generator (heterogeneous nodes, other vjob and memory
sizes, more computing VMs, another seed) rather than the benchmark's workload.generate, so the
planner is not tuned to one family only.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from preemption.decisions import fcfs_selection
from preemption.planner import Instance, NodeSpec, Plan, VMSpec, make_plan, validate
from preemption.planner.placement import first_fit_decreasing, pack, sticky_pack
from vjob.model import VJobState

R, S, W = VJobState.RUNNING, VJobState.SLEEPING, VJobState.WAITING
VJOB = str(Path(sys.executable).parent / "vjob")


# No test here bounds the wall clock: how long a plan takes for its budget is measured by
# bench/planner.py (large instances planned as `vjob plan` does). A test checks what the budget
# decides (a budget already spent leaves CP-SAT out) and bounds a hang with a generous timeout.
HANG_S = 600
"""The subprocess timeout of `vjob plan`: the failures these tests guard against took minutes."""


def crowded(n_nodes: int, n_vms: int, seed: int) -> Instance:
    """Half the nodes 2 CPU / 4 GB, half 4 CPU / 8 GB; vjobs of 4..24 VMs of 128..3072 MB, 3 in 4
    computing; random states (running VMs placed where memory fits), targets by FCFS in random
    order, so the cluster is nearly full after the decision."""
    rng = random.Random(seed)
    nodes = tuple(NodeSpec(f"h{i:04d}", 2, 4096) if i % 2 else NodeSpec(f"h{i:04d}", 4, 8192) for i in range(n_nodes))
    free = {n.id: n.mem for n in nodes}
    ids = [n.id for n in nodes]
    vms: list[VMSpec] = []
    j = 0
    while len(vms) < n_vms:
        size = min(rng.randint(4, 24), n_vms - len(vms))
        state = rng.choice((W, R, S))
        demands = [(1 if rng.random() < 0.75 else 0, 128 * rng.randint(1, 24)) for _ in range(size)]
        hosts: list[str | None] = [None] * size
        if state is R:
            for k, (_, mem) in enumerate(demands):
                fits = [n for n in rng.sample(ids, 16) if free[n] >= mem]
                if not fits:
                    state = S
                    for n, (_, m) in zip(hosts[:k], demands[:k], strict=True):
                        free[str(n)] += m
                    break
                hosts[k] = fits[0]
                free[fits[0]] -= mem
        if state is S:
            hosts = [rng.choice(ids) for _ in range(size)]
        for k, (cpu, mem) in enumerate(demands):
            vms.append(VMSpec(f"u{j:04d}v{k:02d}", f"u{j:04d}", cpu, mem, state, hosts[k]))
        j += 1
    raw = Instance(nodes, tuple(vms))
    queue = sorted(raw.vjobs())
    rng.shuffle(queue)
    return raw.with_target(fcfs_selection(raw, queue).target)


def plan_from_cli(tmp_path: Path, inst: Instance, *extra: str) -> Plan:
    path = tmp_path / "instance.json"
    path.write_text(json.dumps(inst.to_dict()))
    proc = subprocess.run([VJOB, "plan", str(path), *extra], capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = Plan.from_dict(json.loads(proc.stdout))
    validate(inst, plan)  # the independent validator, on the plan as printed
    return plan


def test_pack_finds_a_placement_where_the_papers_ffd_strands_cpus() -> None:
    # Memory first puts the two idle 2 GB VMs on n1 (its 2 CPUs stranded) and leaves a computing VM out.
    nodes = (NodeSpec("n1", 2, 4096), NodeSpec("n2", 2, 4096))
    vms = tuple(VMSpec(f"idle{k}", "a", 0, 2048, W) for k in range(2)) + tuple(
        VMSpec(f"busy{k}", "b", 1, 1024, W) for k in range(4)
    )
    assert first_fit_decreasing(nodes, vms)[1]
    placed, left = pack(nodes, vms)
    assert not left
    assert sorted(placed.values()).count("n1") == 3


def test_heuristics_alone_plan_a_crowded_cluster_the_papers_ffd_cannot_pack() -> None:
    # A budget too short for CP-SAT: the plan comes from the packing heuristics, still valid.
    inst = crowded(60, 300, seed=11)
    assert first_fit_decreasing(inst.nodes, inst.to_run())[1]
    plan = make_plan(inst, time_limit_s=0.01)
    validate(inst, plan)
    assert plan.optimizer != "cpsat"
    assert plan.stats["cpsat_status"].startswith("NOT_RUN")


@pytest.mark.slow
def test_plan_command_answers_a_1000_node_5000_vm_instance_within_its_budget(tmp_path: Path) -> None:
    # Before: no starting placement from the command line, a 4-million-variable retry built in
    # Python for minutes, then "no viable placement ... found in time".
    inst = crowded(1000, 5000, seed=2024)
    assert first_fit_decreasing(inst.nodes, inst.to_run())[1], "the instance should defeat the paper's FFD"
    plan = plan_from_cli(tmp_path, inst, "--time-limit", "20")  # a hang: HANG_S; its time: bench/planner.py
    # Under load CP-SAT may end UNKNOWN within the budget: the plan is then the heuristics' own
    # (validated above), said in one warning; any other warning is a failure.
    assert not [w for w in plan.warnings if "falling back" not in w], plan.warnings


def test_plan_command_budget_includes_the_model_on_a_crowded_instance(tmp_path: Path) -> None:
    """The budget counts from the command's start (parsing, heuristics, model building): one
    spent by then leaves CP-SAT out, and the heuristics' plan comes back, valid. A budget that
    started after the model would have let CP-SAT run."""
    inst = crowded(200, 1000, seed=5)
    plan = plan_from_cli(tmp_path, inst, "--time-limit", "0.05")
    assert str(plan.stats["cpsat_status"]).startswith("NOT_RUN"), plan.stats
    assert plan.optimizer != "cpsat"


def test_plan_command_start_placement(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inst = crowded(20, 80, seed=3)
    start, left = sticky_pack(inst)
    assert not left
    (tmp_path / "start.json").write_text(json.dumps({"placement": start, "pools": []}))
    plan = plan_from_cli(tmp_path, inst, "--time-limit", "5", "--start", str(tmp_path / "start.json"))
    assert "cost_hint" in plan.stats
    assert plan.cost <= plan.stats["cost_hint"]
    # A start that overloads a node is ignored with a warning, not obeyed.
    node = inst.nodes[0].id
    bad = dict.fromkeys(start, node)
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    plan = plan_from_cli(tmp_path, inst, "--time-limit", "5", "--start", str(tmp_path / "bad.json"))
    assert any(f"hint ignored: it overloads node {node}" in w for w in plan.warnings)
    # A start that is not a placement is refused with the field named, exit 2.
    (tmp_path / "junk.json").write_text(json.dumps({"v": 3}))
    (tmp_path / "i.json").write_text(json.dumps(inst.to_dict()))
    proc = subprocess.run(
        [VJOB, "plan", str(tmp_path / "i.json"), "--start", str(tmp_path / "junk.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "start placement" in proc.stderr and "'v' = '3': must be a node id" in proc.stderr


def test_make_plan_budget_counts_from_the_callers_start() -> None:
    """The caller already spent the whole budget before the call: no CP-SAT, the heuristics'
    plan, valid, and the planner's own count starts at the caller's start (a budget counted from
    the call would have run CP-SAT for 1.5 s)."""
    inst = crowded(100, 500, seed=8)
    began = time.perf_counter() - 1.5
    plan = make_plan(inst, time_limit_s=1.5, started=began)
    validate(inst, plan)
    assert str(plan.stats["cpsat_status"]).startswith("NOT_RUN"), plan.stats
    assert plan.stats["seconds"] >= 1.5
