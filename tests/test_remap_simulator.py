"""The heterogeneous replay: baseline fastest-free-first vs ARRIVE-F remapping."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from preemption.remap.policy import RemapParams
from simulator.lublin import generate
from simulator.remap_engine import simulate
from simulator.remap_jobs import RemapJobs, at_load, jobs_from_workload
from simulator.subclusters import load_farm, parse_farm

PAPER = Path(__file__).resolve().parents[1] / "docs" / "remap" / "arrive-f.toml"


def _farm(third: bool = False) -> object:
    subs = [
        {"name": "fast", "nodes": 1, "cores_per_node": 4, "memory_mb_per_node": 4096, "freq_ghz": 3.0},
        {"name": "slow", "nodes": 1, "cores_per_node": 4, "memory_mb_per_node": 1024, "freq_ghz": 1.5},
    ]
    time = {"fast": 1.0, "slow": 2.0}
    if third:
        subs.append({"name": "mid", "nodes": 1, "cores_per_node": 4, "memory_mb_per_node": 4096, "freq_ghz": 2.0})
        time["mid"] = 1.5
    kinds = [
        {"name": "EP", "memory_mb_per_core": 100, "time": time},
        {"name": "FT", "memory_mb_per_core": 700, "time": time},
    ]
    return parse_farm({"thrash_factor": 3.0, "subcluster": subs, "kind": kinds}, "test")


def _jobs(submit: list[float], kind: list[int], runtime: list[float], slots: list[int]) -> RemapJobs:
    return RemapJobs(np.array(submit, float), np.array(slots), np.array(kind), np.array(runtime, float))


def test_cpu_bound_job_moves_to_the_fast_cluster_when_it_frees() -> None:
    farm = _farm()
    jobs = _jobs([0, 1], [0, 0], [1000, 1000], [4, 4])
    base = simulate(farm, jobs, "none")  # type: ignore[arg-type]
    assert base.end[1] == pytest.approx(1 + 2000)
    params = RemapParams(tau_s=50, beta=20, threshold_s=60)
    moved = simulate(farm, jobs, "arrive-f", params)  # type: ignore[arg-type]
    assert moved.migrations.tolist() == [0, 1]
    assert moved.decisions == {"move_gain": 1}
    # ticks every τ from the first start (50, 100, ..., 1000): the tick at 1000 sees the fast
    # cluster free and moves it; it lost the migration's seconds, the rest runs at full speed
    done_at_tick = (1000 - 1) / 2000
    mig = 100 * 1.2 / 110.0
    assert moved.end[1] == pytest.approx(1000 + mig + (1 - done_at_tick) * 1000)
    assert moved.end[1] < base.end[1] - 400


def test_thrashing_job_moves_at_once() -> None:
    farm = _farm(third=True)
    # fast busy for long; mid busy until 100; FT lands on slow (1 GB / 4 cores) and thrashes
    jobs = _jobs([0, 0, 1], [0, 0, 1], [5000, 60, 1000], [4, 4, 4])
    base = simulate(farm, jobs, "none")  # type: ignore[arg-type]
    out = simulate(farm, jobs, "arrive-f", RemapParams(threshold_s=1e9))  # type: ignore[arg-type]
    assert out.decisions == {"move_thrashing": 1}
    assert out.end[2] < base.end[2] / 2


def test_every_job_runs_once_and_cores_never_overbooked() -> None:
    farm = load_farm(PAPER)
    w = generate(8, 200, seed=4)
    w.runtime[:] = np.clip(w.runtime, 60, 3600)
    jobs = at_load(jobs_from_workload(w, farm, 4), 32, 1.0)
    for remap in ("none", "arrive-f"):
        r = simulate(farm, jobs, remap, seed=4)  # type: ignore[arg-type]
        assert np.all(r.start >= r.submit) and np.all(r.end > r.start)
        # at every start instant the cores in use stay within the farm's 32
        for t in r.start:
            in_use = jobs.slots[(r.start <= t) & (r.end > t)].sum()
            assert in_use <= 32


def test_paper_stream_remapping_gains_in_the_papers_direction() -> None:
    farm = load_farm(PAPER)
    w = generate(8, 330, seed=1)
    w.runtime[:] = np.clip(w.runtime, 60, 3600)
    jobs = at_load(jobs_from_workload(w, farm, 1), 32, 0.9)
    base = simulate(farm, jobs, "none", seed=1).summary()  # type: ignore[arg-type]
    remap = simulate(farm, jobs, "arrive-f", seed=1).summary()  # type: ignore[arg-type]
    assert remap["throughput_jobs_h"] > base["throughput_jobs_h"]
    assert remap["mean_wait_s"] < base["mean_wait_s"]
    assert remap["migrations"] > 0


def _claims_jobs() -> RemapJobs:
    # On fast (4 slots), X1 and X2 (2 slots each); on mid, Y (4); on slow (1 GB for 4 cores), A (FT,
    # thrashing) and B. I, interactive, arrives at the first remap tick (t = 50) and fits nowhere.
    return _jobs([0, 0, 0, 0, 0, 50], [0, 0, 0, 1, 0, 0], [9000, 9000, 9000, 9000, 9000, 500], [2, 2, 4, 2, 2, 2])


def test_vjob_policy_an_interactive_job_preempts_the_newest_batch_job_which_resumes_with_its_progress() -> None:
    farm = _farm(third=True)
    inter = np.array([0, 0, 0, 0, 0, 1], bool)
    base = simulate(farm, _claims_jobs(), "none")  # type: ignore[arg-type]
    r = simulate(farm, _claims_jobs(), "none", policy="vjob", interactive=inter)  # type: ignore[arg-type]
    assert base.start[5] == pytest.approx(9000) and r.start[5] == 50  # waited for a free slot vs at once
    assert r.preemptions.tolist() == [1, 0, 0, 0, 0, 0] and r.summary()["preemptions"] == 1  # fastest sub-cluster
    ck = 100 / 500  # a VM's memory (EP: 100 MB per core) over the checkpoint bandwidth
    assert r.end[5] == pytest.approx(50 + ck + 500)  # it starts once the checkpoint is written
    # X1 ran 50 s, slept while I ran, resumed on fast (a local read of its state) and lost nothing else
    assert r.end[0] == pytest.approx(r.end[5] + ck + 9000 - 50)
    assert r.summary()["mean_wait_interactive_s"] == 0 and r.summary()["policy"] == "vjob"
    with pytest.raises(ValueError, match="policy 'ubis'"):
        simulate(farm, _claims_jobs(), "none", policy="ubis")  # type: ignore[arg-type]


def test_vjob_policy_remapping_leaves_alone_what_the_pass_claims_in_the_same_instant() -> None:
    # At t = 50 the pass checkpoints X1 and gives fast to I; A thrashes on slow and would swap with
    # X2 on fast at once. The claims (preemption.remap.claims, a sub-cluster for a node) leave fast
    # alone in that instant: A swaps one tick later, and neither the victim nor I ever moves.
    farm = _farm(third=True)
    params = RemapParams(threshold_s=1e9)  # thrashing moves only
    alone = simulate(farm, _claims_jobs(), "arrive-f", params)  # type: ignore[arg-type]
    inter = np.array([0, 0, 0, 0, 0, 1], bool)
    both = simulate(farm, _claims_jobs(), "arrive-f", params, policy="vjob", interactive=inter)  # type: ignore[arg-type]
    assert alone.decisions == {"swap_thrashing": 1} and alone.migrations[3] == 1
    assert both.decisions == {"skipped_claims": 2, "swap_thrashing": 1}  # X2 and I, left out at t = 50
    assert both.migrations.tolist() == [0, 1, 0, 1, 0, 0]
    tm = 700 * 1.2 / 110  # A's migration (FT: 700 MB per core)
    # on slow A runs 6× slower (2× the clock, 3× thrashing), on fast at the reference speed
    assert alone.end[3] - tm == pytest.approx(50 + 9000 - 50 / 6)  # moved at 50
    assert both.end[3] - tm == pytest.approx(100 + 9000 - 100 / 6)  # moved at the next tick


def test_cli_compares_remaps_and_rejects_bad_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from vjob.cli import main

    trace = tmp_path / "l.swf"
    assert main(["trace", "generate", "--nodes", "8", "--jobs", "60", "--seed", "2", "-o", str(trace)]) == 0
    out = tmp_path / "out"
    argv = ["simulate", "--subclusters", str(PAPER), "--trace", str(trace), "--seeds", "1,2", "--out", str(out)]
    assert main(argv) == 0
    doc = json.loads((out / "remap_summary.json").read_text())
    assert [(r["seed"], r["remap"]) for r in doc["runs"]] == [
        (1, "none"),
        (1, "arrive-f"),
        (2, "none"),
        (2, "arrive-f"),
    ]
    assert all(r["jobs"] == 60 for r in doc["runs"])
    assert set(doc["change_pct_vs_none"]["arrive-f"]) >= {"throughput_jobs_h", "mean_wait_s"}
    assert main([*argv[:-2], "--remap", "arrive-g", "--out", str(out)]) == 2
    assert "--remap = 'arrive-g': must be one of none, arrive-f" in capsys.readouterr().err
    assert main(["simulate", "--trace", str(trace), "--out", str(out)]) == 2
    assert "--nodes: required" in capsys.readouterr().err
    capsys.readouterr()
    assert main([*argv, "--policy", "vjob", "--interactive-frac", "0.3"]) == 0
    doc = json.loads((out / "remap_summary.json").read_text())
    assert doc["policy"] == "vjob" and all(r["policy"] == "vjob" for r in doc["runs"])
    assert main([*argv, "--policy", "ubis"]) == 2
    assert "--policy = 'ubis': with --subclusters it must be one of fcfs-easy, vjob" in capsys.readouterr().err
    assert main([*argv, "--policy", "vjob", "--interactive-frac", "2"]) == 2
    assert "--interactive-frac = '2'" in capsys.readouterr().err
