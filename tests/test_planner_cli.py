"""`vjob plan`: formats, exit codes and the messages of bad or infeasible instances; decision modules."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from preemption.decisions import fcfs_selection, ubis_selection
from preemption.planner import Instance, NodeSpec, NoViablePlacementError, VMSpec, make_plan, validate
from vjob import log
from vjob.cli import main
from vjob.errors import InputError
from vjob.model import VJobState

R, S, W = VJobState.RUNNING, VJobState.SLEEPING, VJobState.WAITING


@pytest.fixture(autouse=True)
def _real_stderr_logging() -> Any:
    """vjob.cli.main binds the log to the sys.stderr of the moment (capsys's, closed after the
    test); point it back at the process's stderr so later tests can still log."""
    yield
    log.configure("warning", "json", stream=sys.__stderr__)


INSTANCE: dict[str, Any] = {
    "nodes": [{"id": "n1", "cpu": 2, "mem": 4096}, {"id": "n2", "cpu": 2, "mem": 4096}],
    "vms": [
        {"id": "v1", "vjob": "j1", "cpu": 1, "mem": 512, "state": "running", "host": "n1"},
        {"id": "v2", "vjob": "j1", "cpu": 1, "mem": 512, "state": "running", "host": "n2"},
        {"id": "v3", "vjob": "j2", "cpu": 1, "mem": 1024, "state": "sleeping", "host": "n2"},
        {"id": "v4", "vjob": "j3", "cpu": 1, "mem": 2048, "state": "waiting", "host": None},
    ],
    "target": {"j1": "sleeping", "j2": "running", "j3": "running"},
}


def write(tmp_path: Path, data: Any, name: str = "instance.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_plan_command_prints_a_valid_plan_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", write(tmp_path, INSTANCE), "--time-limit", "5"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pools"][0][0]["action"] in {"suspend", "resume", "run"}
    assert set(out["placement"]) == {"v3", "v4"}
    assert out["placement"]["v3"] == "n2"  # resumed where its state lies
    # The printed plan passes the validator, through the command's own --check.
    plan_path = write(tmp_path, out, "plan.json")
    assert main(["plan", write(tmp_path, INSTANCE), "--check", plan_path]) == 0
    assert "is valid" in capsys.readouterr().out


def test_plan_command_text_format_and_ffd(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "vjob"),
            "plan",
            write(tmp_path, INSTANCE),
            "--optimizer",
            "ffd",
            "--format",
            "text",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("pool 0: ")
    assert "optimizer ffd" in proc.stdout


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["vms"][0].update(host="n9"), "vm v1: host = 'n9': unknown node"),
        (lambda d: d["vms"][1].update(id="v1"), "duplicate vm id 'v1'"),
        (lambda d: d["nodes"].append({"id": "n1", "cpu": 1, "mem": 1}), "duplicate node id 'n1'"),
        (lambda d: d["vms"][3].update(mem=8192), "vm v4: needs cpu 1 and mem 8192 MB: larger than any node"),
        (lambda d: d["vms"][0].update(state="paused"), "vms[0].state = 'paused': must be one of waiting, running"),
        (lambda d: d["target"].update(j3="sleeping"), "target.j3 = 'sleeping': a waiting vjob cannot become sleeping"),
        (lambda d: d["vms"][1].update(state="sleeping"), "vjob j1: its VMs are in different states"),
        (lambda d: d["vms"][2].update(mem="lots"), "vms[2].mem = 'lots': must be an integer >= 1"),
    ],
)
def test_invalid_instances_exit_2_naming_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mutate: Any, message: str
) -> None:
    data = json.loads(json.dumps(INSTANCE))
    mutate(data)
    assert main(["plan", write(tmp_path, data)]) == 2
    assert message in capsys.readouterr().err


def test_unreadable_and_non_json_instances_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{nodes: [")
    assert main(["plan", str(bad)]) == 2
    assert "not JSON (line 1" in capsys.readouterr().err


def test_infeasible_cpu_names_the_short_resource(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(json.dumps(INSTANCE))
    data["target"] = {"j1": "running", "j2": "running", "j3": "running"}
    data["nodes"] = [{"id": "n1", "cpu": 1, "mem": 4096}, {"id": "n2", "cpu": 2, "mem": 4096}]
    assert main(["plan", write(tmp_path, data), "--time-limit", "5"]) == 2
    err = capsys.readouterr().err
    assert "cpu is short on every node: the VMs to run need 4 CPUs, the nodes offer 3" in err


def test_infeasible_fragmented_memory_names_the_nodes() -> None:
    # 1536 + 1536 + 1024 MB exactly fill two 2048 MB nodes in total, but cannot be packed.
    inst = Instance(
        nodes=(NodeSpec("a", 4, 2048), NodeSpec("b", 4, 2048)),
        vms=(
            VMSpec("x", "j", 1, 1536, W),
            VMSpec("y", "j", 1, 1536, W),
            VMSpec("z", "j", 1, 1024, W),
        ),
        target={"j": R},
    )
    with pytest.raises(NoViablePlacementError) as err:
        make_plan(inst, time_limit_s=5)
    text = str(err.value)
    assert "does not pack" in text and "vm z" in text
    assert "memory is short on all nodes (most free: a 512 MB free, b 512 MB free)" in text


def figure6() -> Instance:
    # Three uniprocessor nodes; vjobs 1 and 2 run, 3 waits; 1 and 3 fit together, 2 does not.
    nodes = tuple(NodeSpec(f"N{i}", 1, 2048) for i in (1, 2, 3))
    vms = (
        VMSpec("a1", "1", 1, 512, R, "N1"),
        VMSpec("a2", "1", 0, 512, R, "N1"),
        VMSpec("b1", "2", 1, 512, R, "N2"),
        VMSpec("b2", "2", 1, 512, R, "N2"),
        VMSpec("b3", "2", 1, 512, R, "N3"),
        VMSpec("c1", "3", 1, 1024, W),
        VMSpec("c2", "3", 0, 1024, W),
    )
    return Instance(nodes, vms)


def test_figure6_fcfs_running_job_selection() -> None:
    inst = figure6()
    sel = fcfs_selection(inst, ["1", "2", "3"])
    assert sel.target == {"1": R, "2": S, "3": R}
    final = inst.with_target(sel.target)
    plan = make_plan(final, time_limit_s=5, hint=sel.placement)
    validate(final, plan)
    assert plan.count()["suspend"] == 3 and plan.count()["run"] == 2


def test_ubis_selection_follows_priorities_and_protects_pinned_vjobs() -> None:
    inst = figure6()
    assert ubis_selection(inst, {"1": 0.1, "2": 0.9, "3": 0.5}).target == {"1": S, "2": R, "3": W}
    pinned = ubis_selection(inst, {"1": 0.1, "2": 0.2, "3": 0.9}, keep_running=["1"])
    assert pinned.target["1"] is R and pinned.target["3"] is R and pinned.target["2"] is S
    with pytest.raises(InputError, match="no priority for vjob"):
        ubis_selection(inst, {"1": 0.1})
    with pytest.raises(InputError, match="missing from the queue"):
        fcfs_selection(inst, ["1", "2"])


def test_sticky_selection_keeps_running_vms_where_they_are() -> None:
    inst = Instance(
        nodes=(NodeSpec("N1", 2, 4096), NodeSpec("N2", 2, 4096)),
        vms=(VMSpec("a1", "A", 1, 1024, R, "N2"), VMSpec("a2", "A", 1, 1024, R, "N2"), VMSpec("b1", "B", 1, 512, W)),
    )
    sticky = fcfs_selection(inst, ["A", "B"])
    plain = fcfs_selection(inst, ["A", "B"], sticky=False)
    assert sticky.target == plain.target == {"A": R, "B": R}
    assert sticky.placement == {"a1": "N2", "a2": "N2", "b1": "N1"}
    assert plain.placement["a1"] == "N1"  # FFD from scratch fills the first node first


def test_instance_from_a_cluster_view() -> None:
    from preemption.planner import instance_from_view
    from vjob.model import VM, ClusterView, Node, NodeState, VMState

    view = ClusterView(
        now=0.0,
        nodes=(Node("n1", 2, 4096), Node("n2", 2, 4096), Node("n3", 2, 4096, state=NodeState.DOWN)),
        vms=(
            VM("j1-0", "j1", "debian", vcpus=1, memory_mb=512, node="n1", state=VMState.RUNNING),
            VM("j2-0", "j2", "debian", vcpus=1, memory_mb=1024, node="n2", state=VMState.SAVED),
            VM("j3-0", "j3", "debian", vcpus=1, memory_mb=256, node=None, state=VMState.DEFINED),
        ),
    )
    inst = instance_from_view(view, {"j1": S, "j2": R, "j3": R})
    assert [n.id for n in inst.nodes] == ["n1", "n2"]
    assert [(v.id, v.vjob, v.state, v.host) for v in inst.vms] == [
        ("j1-0", "j1", R, "n1"),
        ("j2-0", "j2", S, "n2"),
        ("j3-0", "j3", W, None),
    ]
    plan = make_plan(inst, time_limit_s=5)
    validate(inst, plan)
    assert plan.placement["j2-0"] == "n2"  # resumed where its state lies
    stranded = ClusterView(
        now=0.0,
        nodes=view.nodes,
        vms=(VM("j4-0", "j4", "debian", node="n3", state=VMState.RUNNING),),
    )
    with pytest.raises(InputError, match="vm j4-0 of job j4: node 'n3' is not usable"):
        instance_from_view(stranded, {})
