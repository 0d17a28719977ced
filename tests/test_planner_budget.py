"""The planner's budget at BtrPlace's scale (issue 37): one deadline from the process's start,
the phases reported, the workers chosen for the machine, and `pull_early` searching nodes by
arrays with the same choice the scan in node order made.

No test here bounds a wall time: bench/planner_scale.py measures it (docs/planner.md, "At
BtrPlace's scale"). These check what the code decides.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

from preemption.decisions import fcfs_selection
from preemption.planner import Instance, NodeSpec, Plan, VMSpec, make_plan, validate
from preemption.planner.clock import default_workers
from preemption.planner.placement import pull_early
from preemption.planner.workload import generate
from vjob.model import VJobState

R, S, W = VJobState.RUNNING, VJobState.SLEEPING, VJobState.WAITING
VJOB = str(Path(sys.executable).parent / "vjob")


def test_process_started_counts_the_time_before_the_first_call() -> None:
    """A process that slept 0.5 s before asking: its start lies at least 0.5 s back."""
    code = (
        "import time; time.sleep(0.5)\n"
        "from preemption.planner.clock import process_started\n"
        "print(time.perf_counter() - process_started())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    age = float(out.stdout)
    assert 0.5 <= age < 120, age


def test_plan_command_counts_its_budget_from_the_process_start(tmp_path: Path) -> None:
    """`vjob plan` reports its phases, start-up and parsing included in the seconds it counts."""
    raw = generate(200, n_nodes=40, seed=3)
    inst = raw.with_target(fcfs_selection(raw, sorted(raw.vjobs())).target)
    path = tmp_path / "i.json"
    path.write_text(json.dumps(inst.to_dict()))
    proc = subprocess.run(
        [VJOB, "plan", "--time-limit", "4", str(path)], capture_output=True, text=True, timeout=600, check=True
    )
    plan = Plan.from_dict(json.loads(proc.stdout))
    validate(inst, plan)
    phases = plan.stats["phases"]
    assert set(phases) >= {"startup", "parse", "heuristics", "model_build", "solve", "sequencing"}, phases
    assert phases["startup"] > 0  # Python's start-up is inside the budget
    assert plan.stats["seconds"] >= phases["startup"] + phases["parse"]
    assert plan.stats["workers"] == default_workers()


def test_default_workers_are_the_cpus_this_process_may_use() -> None:
    assert default_workers() == max(1, min(8, len(os.sched_getaffinity(0))))
    inst = generate(40, n_nodes=10, seed=1)
    assert make_plan(inst, time_limit_s=2).stats["workers"] == default_workers()
    assert make_plan(inst, time_limit_s=2, workers=1).stats["workers"] == 1


def _late_on_a(moving: VMSpec) -> tuple[Instance, dict[str, str]]:
    """Node a is full at the start (r runs there and must sleep); `moving` is placed on a, so it
    would wait for the first pool; b and c are empty."""
    nodes = (NodeSpec("a", 1, 1024), NodeSpec("b", 1, 1024), NodeSpec("c", 1, 1024))
    r = VMSpec("r", "jr", 1, 1024, R, "a")
    inst = Instance(nodes, (r, moving), {"jr": S, moving.vjob: R})
    return inst, {moving.id: "a"}


def test_pull_early_sends_a_late_vm_home_when_home_has_room() -> None:
    # b comes first in node order and has room, but the state lies on c: a local resume.
    inst, placement = _late_on_a(VMSpec("s", "js", 1, 512, S, "c"))
    assert pull_early(inst, placement) == {"s": "c"}


def test_pull_early_sends_a_late_waiting_vm_to_the_first_node_with_room() -> None:
    inst, placement = _late_on_a(VMSpec("w", "jw", 1, 512, W, None))
    assert pull_early(inst, placement) == {"w": "b"}


def test_pull_early_keeps_a_pinned_vm_and_a_vm_with_nowhere_to_go() -> None:
    inst, placement = _late_on_a(VMSpec("p", "jp", 1, 512, S, "a", pinned=True))
    assert pull_early(inst, placement) == placement
    nodes = (NodeSpec("a", 1, 1024), NodeSpec("b", 1, 256))  # b too small: s waits on a
    inst = Instance(nodes, (VMSpec("r", "jr", 1, 1024, R, "a"), VMSpec("s", "js", 1, 512, S, "b")), {"jr": S, "js": R})
    assert pull_early(inst, {"s": "a"}) == {"s": "a"}


def test_pull_early_keeps_large_placements_viable() -> None:
    """On the bench's family (crowded after FCFS), the repaired placement still fits every node."""
    raw = generate(3000, n_nodes=600, seed=11)
    queue = sorted(raw.vjobs())
    random.Random(11).shuffle(queue)
    sel = fcfs_selection(raw, queue)
    inst = raw.with_target(sel.target)
    out = pull_early(inst, dict(sel.placement))
    assert set(out) == set(sel.placement)
    moved = [v for v in out if out[v] != sel.placement[v]]
    assert moved, "the instance should have VMs that wait"
    vms = inst.vm_by_id
    for node in inst.nodes:
        here = [vms[v] for v, n in out.items() if n == node.id]
        assert sum(v.cpu for v in here) <= node.cpu and sum(v.mem for v in here) <= node.mem
