"""The heterogeneous replay: baseline fastest-free-first vs ARRIVE-F remapping."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from preemption.remap.policy import RemapParams
from simulator.lublin import generate
from simulator.remap_engine import RemapJobs, at_load, jobs_from_workload, simulate
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
