"""Benchmark of `vjob tune`: trials per hour with 1, 2 and 4 workers, and the issue's goal on
a Lublin-model trace and a real one (wagap 2013), measured on the held-back 30 %.

Workers are `vjob tune worker` processes sharing one SQLite study, as array tasks would share
a PostgreSQL one. The goal part runs one study per trace (TPE, interactive_response and
batch_slowdown, the seven weights and the cap searched under `ubis`), then `vjob tune show`
replays its Pareto front, the configured (paper) weights and MMS on the held-back part. The
last line is one JSON object: {"bench": "tune", "workers": {...}, "goal": {...}}.

    .venv/bin/python bench/tune.py [--trials 24] [--jobs 5000] [--scaling-trials 16] [--png-dir docs/tune]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna

REPO = Path(__file__).resolve().parents[1]
VJOB = [sys.executable, "-m", "vjob.cli"]
TRACES = {
    "lublin": ["--trace", str(REPO / "tests/data/traces/lublin_256.swf"), "--nodes", "256"],
    "wagap": ["--trace", str(REPO / "tests/data/traces/wagap-2013.swf"), "--nodes", "768", "--lenient"],
}
"""The Lublin-Feitelson trace of tests/data (256 nodes, offered load 1.06) and the real wagap
(CERIT-SC 2013) trace on 768 of its 2,176 CPUs, where batch jobs queue (utilisation ~0.7)."""
SETUP = [
    *("--interactive-frac", "0.2", "--interactive-mean-size", "30", "--sampler", "tpe", "--no-progress"),
    *("--policy", "ubis"),  # the figures of docs/tune.md were measured with the weights, under ubis
]


def _vjob(*argv: str) -> str:
    return subprocess.run([*VJOB, *argv], check=True, capture_output=True, text=True).stdout


def _workers(url: str, study: str, count: int) -> tuple[float, float]:
    """Seconds until `count` worker processes have finished `study` together, and the CPU
    seconds they used (user + system)."""
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    procs = [
        subprocess.Popen(
            [*VJOB, "tune", "worker", "--study", study, "--storage", url, "--no-progress"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"worker of {study} failed ({p.returncode})")
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return time.perf_counter() - started, cpu


def scaling(tmp: Path, trials: int, jobs: int) -> dict[str, dict[str, float]]:
    out = {}
    for count in (1, 2, 4):
        url = f"sqlite:///{tmp / f'scale{count}.sqlite'}"
        _vjob(
            "tune",
            "run",
            *TRACES["lublin"],
            *SETUP,
            "--max-jobs",
            str(jobs),
            "--trials",
            str(trials),
            "--study",
            "scale",
            "--storage",
            url,
            "--no-defaults",
            "--submit",
            "none",
        )
        seconds, cpu = _workers(url, "scale", count)
        done = len(
            optuna.load_study(study_name="scale", storage=url).get_trials(states=(optuna.trial.TrialState.COMPLETE,))
        )
        load = os.getloadavg()[0]
        out[str(count)] = {
            "seconds": seconds,
            "cpu_seconds": cpu,
            "trials": done,
            "trials_per_hour": done / seconds * 3600,
            "load": load,
        }
        print(
            f"{count} worker(s): {done} trials in {seconds:.1f} s, {done / seconds * 3600:,.0f} trials/h, "
            f"{cpu:.1f} CPU s (machine load average {load:.1f} on {os.cpu_count()} cores)"
        )
    base = out["1"]["trials_per_hour"]
    for v in out.values():
        v["ratio"] = v["trials_per_hour"] / base
    return out


def goal(tmp: Path, trials: int, jobs: int, png_dir: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, trace in TRACES.items():
        url = f"sqlite:///{tmp / f'goal-{name}.sqlite'}"
        started = time.perf_counter()
        _vjob(
            "tune",
            "run",
            *trace,
            *SETUP,
            "--max-jobs",
            str(jobs),
            "--trials",
            str(trials),
            "--study",
            name,
            "--storage",
            url,
            "--submit",
            "none",
        )
        _workers(url, name, 2)  # wall and CPU seconds: tune_seconds below
        tuned_s = time.perf_counter() - started
        doc = json.loads(_vjob("tune", "show", name, "--storage", url, "--json", "--png", str(png_dir / f"{name}.png")))
        rows = {r["name"]: r for r in doc["rows"]}
        verdict = doc["verdict"]
        best = verdict["dominate_defaults_and_batch_le_mms"] or verdict["dominate_defaults"]
        pick = rows[f"trial {best[0]}"] if best else None
        chosen = None
        if pick is not None:
            chosen = {"trial": pick["trial"], "test": [*pick["test"], pick["batch_response"]], "params": pick["params"]}
        out[name] = {
            "jobs": jobs,
            "trials": trials,
            "tune_seconds": tuned_s,
            "front": [r["trial"] for r in doc["rows"] if r["trial"] is not None],
            "defaults": [*rows["defaults"]["test"], rows["defaults"]["batch_response"]],
            "mms": [*rows["mms"]["test"], rows["mms"]["batch_response"]],
            "chosen": chosen,
            "dominate_defaults": verdict["dominate_defaults"],
            "dominate_defaults_and_batch_le_mms": verdict["dominate_defaults_and_batch_le_mms"],
        }
        said = "none" if chosen is None else f"trial {chosen['trial']} {_fmt(chosen['test'])}"
        print(
            f"{name}: front {out[name]['front']}; held back [interactive response s, batch slowdown, "
            f"batch response s]: "
            f"defaults {_fmt(out[name]['defaults'])}, mms {_fmt(out[name]['mms'])}, chosen {said}"
        )
    return out


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=24, help="trials per goal study")
    parser.add_argument("--jobs", type=int, default=5000, help="trace jobs per goal study (first N)")
    parser.add_argument("--scaling-trials", type=int, default=16)
    parser.add_argument("--scaling-jobs", type=int, default=1500)
    parser.add_argument("--png-dir", default=str(REPO / "docs" / "tune"))
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument("--skip-goal", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vjob-bench-tune-") as tmp:
        workers = {} if args.skip_scaling else scaling(Path(tmp), args.scaling_trials, args.scaling_jobs)
        results = {} if args.skip_goal else goal(Path(tmp), args.trials, args.jobs, Path(args.png_dir))
    print(json.dumps({"bench": "tune", "workers": workers, "goal": results}))


if __name__ == "__main__":
    main()
