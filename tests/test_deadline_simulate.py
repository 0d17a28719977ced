"""The deadline replay: its accounting, the configurations' effects, and `vjob simulate
--deadline-buffer ... --admission ...` on a real trace."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from preemption.deadline import VOModel
from simulator.deadline_engine import Cluster, DeadlineSetup, simulate_deadline
from simulator.deadline_reproduce import configurations, reproduce
from simulator.deadline_workload import DJob, paper_workload
from vjob.cli import main
from vjob.config import parse, parse_toml

NASA = Path(__file__).parent / "data" / "traces" / "NASA-iPSC-1993-3.1-cln.swf.gz"
CLUSTER = Cluster(nodes=4)


@pytest.fixture(scope="module")
def workload() -> list[DJob]:
    return paper_workload(600, cores=16, load=0.7, buffer=0.05, seed=3)


def _accounted(s: dict) -> int:
    return round(s["success_rate"] * s["jobs"]) + s["missed"] + s["cancelled"] + s["rejected"]


def test_every_job_ends_in_exactly_one_outcome(workload: list[DJob]) -> None:
    for setup in configurations({"static_x": 0.05}, seed=1):
        s = simulate_deadline(workload, CLUSTER, setup, VOModel.default()).summary()
        assert _accounted(s) == s["jobs"] == len(workload), setup.name


def test_alone_on_an_empty_cluster_physical_jobs_all_succeed_and_vms_pay_the_overhead() -> None:
    jobs = [
        DJob(id=i, submit=i * 10 * 86400.0, duration=3600, estimate=3600, deadline=i * 10 * 86400.0 + 3780, kind=k)
        for i, k in enumerate(["cpu", "mem", "io"] * 3)
    ]
    physical = simulate_deadline(jobs, CLUSTER, DeadlineSetup(physical=True, admission="none"), VOModel.default())
    assert physical.succeeded == len(jobs)
    # in a VM: cpu (2 %) fits the 5 % buffer, mem (5 %) just does (ends on its deadline), io (10 %) never
    virtual = simulate_deadline(
        jobs, CLUSTER, DeadlineSetup(vo_managed=False, admission="none", noise=0.0), VOModel.default()
    )
    assert virtual.succeeded == 6 and virtual.missed == 3
    # VO-managed with X = 0.01: the io jobs (x = 0.045) are refused instead of run to their
    # deadline; the mem ones (x = 0, just in time) are accepted
    managed = simulate_deadline(
        jobs, CLUSTER, DeadlineSetup(admission="static", static_x=0.01, noise=0.0), VOModel.default()
    )
    assert managed.rejected == 3 and managed.succeeded == 6 and managed.wasted_core_s == 0 < virtual.wasted_core_s


def test_adaptive_x_stays_in_its_bounds_during_a_replay(workload: list[DJob]) -> None:
    setup = DeadlineSetup(admission="adaptive", static_x=0.5, x_min=0.2, x_max=0.6, delta_x=0.5, target=0.05)
    r = simulate_deadline(workload, CLUSTER, setup, VOModel.default())
    xs = [x for _, x, _ in r.series]
    assert xs and all(0.2 <= x <= 0.6 for x in xs)
    assert min(xs) < 0.5  # it moved: the failure rate here is far above 5 %


def test_checkpointing_keeps_progress_where_cancelling_loses_it(workload: list[DJob]) -> None:
    base = DeadlineSetup(admission="static", static_x=0.0)
    cancel = simulate_deadline(workload, CLUSTER, base, VOModel.default())
    ckpt = simulate_deadline(workload, CLUSTER, replace(base, action="checkpoint"), VOModel.default())
    assert cancel.checkpointed == 0 and ckpt.checkpointed > 0
    assert _accounted(ckpt.summary()) == len(workload)


def test_vjob_simulate_deadline_on_a_real_trace(tmp_path: Path) -> None:
    out = tmp_path / "nasa"
    args = ["simulate", "--trace", str(NASA), "--nodes", "128", "--max-jobs", "400", "--no-plots"]
    assert main([*args, "--deadline-buffer", "0.05", "--admission", "none,static", "--sweep", "--out", str(out)]) == 0
    docs = {a: json.loads((out / a / "summary.json").read_text()) for a in ("none", "static")}
    for a, doc in docs.items():
        d = doc["deadline"]
        assert doc["admission"] == a and doc["deadline_buffer"] == 0.05 and doc["jobs"] == 400
        assert set(d) >= {"success_rate", "miss_rate", "rejected", "cancelled", "checkpointed"}
        assert 0 <= d["success_rate"] <= 1 and _accounted(d) == d["jobs"]
    assert docs["none"]["deadline"]["cancelled"] == docs["none"]["deadline"]["rejected"] == 0
    assert main([*args, "--admission", "sometimes", "--out", str(out / "bad")]) == 2


def test_the_reproduction_trains_and_writes_a_loadable_deadline_section(tmp_path: Path) -> None:
    doc = reproduce(
        training_hours=200, steady_hours=200, nodes=2, load=0.7, buffer=0.05, seed=5, vo=VOModel.default(), out=tmp_path
    )
    names = [s["config"] for s in doc["results"]]
    assert names == ["alg_1", "alg_2", "alg_3", "alg_4", "alg_5", "alg_5c"]
    trained = doc["trained"]
    assert trained["admission"] == max(trained["training_success"], key=trained["training_success"].get)
    cfg = parse(parse_toml((tmp_path / "trained.toml").read_bytes(), "trained.toml"))
    assert cfg.deadline.admission == trained["admission"] and cfg.deadline.static_x == trained["static_x"]
    assert (tmp_path / "rates.png").stat().st_size > 0 and (tmp_path / "threshold.png").stat().st_size > 0


DECISIONS = (
    "admit",
    "held_verdict",
    "continuation",
    "resume_x",
    "predicted_remaining",
    "adaptive_threshold",
    "cdf_threshold",
    "failure_rate",
)
"""The decision functions the agent's deadline duty (agent/deadline.py) calls."""


def test_the_replay_decides_with_the_agents_functions_not_a_copy(
    workload: list[DJob], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No differential test is needed for the deadline replay's admission and continuation:
    it has no copy of the rules. Its names are the very objects of `preemption.deadline` that
    agent/deadline.py calls, and every outcome of a replay traces back to their answers: each
    cancellation is a `continuation` CANCEL (running) or a `held_verdict` CANCEL (waiting,
    hopeless), each checkpoint a `continuation` CHECKPOINT, each refusal a false `admit`."""
    import agent.deadline as live
    import preemption.deadline as shared
    import simulator.deadline_engine as replay

    for name in (*DECISIONS, "x_factor"):
        assert getattr(replay, name) is getattr(shared, name), name
    for name in DECISIONS:
        assert getattr(live, name) is getattr(shared, name), name

    answers: dict[str, list[object]] = {name: [] for name in DECISIONS}

    def spy(name: str) -> object:
        def call(*args: object, **kwargs: object) -> object:
            out = getattr(shared, name)(*args, **kwargs)
            answers[name].append(out)
            return out

        return call

    for name in DECISIONS:
        monkeypatch.setattr(replay, name, spy(name))
    setup = DeadlineSetup(admission="adaptive", static_x=0.0, x_min=0.0, action="checkpoint")
    r = simulate_deadline(workload, CLUSTER, setup, VOModel.default())
    assert r.cancelled == answers["continuation"].count(shared.Continuation.CANCEL) + answers["held_verdict"].count(
        shared.Held.CANCEL
    )
    assert r.checkpointed == answers["continuation"].count(shared.Continuation.CHECKPOINT) > 0
    assert 0 < r.rejected <= answers["admit"].count(False)
    assert len(answers["adaptive_threshold"]) == len(answers["failure_rate"]) - len(r.series) > 0
