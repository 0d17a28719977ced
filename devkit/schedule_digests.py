"""SHA-256 of every schedule the simulator writes, for every policy and replay, at 20,000 jobs.

Why through the command line: a refactoring of the simulator's insides must leave what it
decides unchanged, and the CSV files `vjob simulate` writes are the schedule as a user sees it,
whatever the functions behind them are called. Run it before and after a change and compare
the JSON (the last line), or give `--expect FILE` with an earlier run's JSON line:

    .venv/bin/python -m devkit.schedule_digests [--jobs 20000] [--expect before.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devkit.architecture import REPO

POLICIES = ("vjob", "fcfs-easy", "mms", "mms-block", "ubis")
COMMON = (
    "--interactive-frac",
    "0.2",
    "--interactive-mean-size",
    "8",
    "--interactive-cap",
    "0.15",
    "--no-plots",
    "--seed",
    "1",
)


def runs(trace: Path, remap_trace: Path) -> dict[str, list[str]]:
    """Name → `vjob simulate` arguments: each policy, the hard cap, the remap and deadline replays
    (the remap replay on its own, shorter trace: with the vjob policy it is quadratic in the queue)."""
    out = {p: ["--trace", str(trace), "--nodes", "256", "--policy", p, *COMMON] for p in POLICIES}
    out["vjob-hard-cap"] = [*out["vjob"], "--cap-mode", "hard"]
    farm = REPO / "docs" / "remap" / "arrive-f.toml"
    for p in ("fcfs-easy", "vjob"):
        out[f"remap-{p}"] = [
            "--trace",
            str(remap_trace),
            "--subclusters",
            str(farm),
            "--remap",
            "none,arrive-f",
            "--policy",
            p,
            "--no-plots",
            "--seeds",
            "1",
        ]
    deadline = ["--trace", str(trace), "--nodes", "256", "--deadline-buffer", "0.05", "--sweep", "--no-plots"]
    out["deadline"] = [*deadline, "--admission", "none,static,adaptive,cdf"]
    out["deadline-physical"] = [*deadline, "--admission", "none", "--physical"]
    out["deadline-checkpoint"] = [*deadline, "--admission", "static", "--deadline-action", "checkpoint"]
    return out


UNDECIDED = frozenset({"wall_seconds", "seconds", "elapsed_s", "trace", "subclusters", "out", "vo_model"})
"""Keys of a summary that are not decisions: timings and the paths of this run's files."""


def _decided(doc: object) -> object:
    if isinstance(doc, dict):
        return {k: _decided(v) for k, v in sorted(doc.items()) if k not in UNDECIDED}
    if isinstance(doc, list):
        return [_decided(v) for v in doc]
    return doc


def digest(directory: Path) -> str:
    """One SHA-256 over every CSV written (the schedule), by relative path; a replay that writes
    no schedule (remap, deadline) is hashed by its summaries without timings or paths, whose
    floats at full precision change with any decision."""
    h = hashlib.sha256()
    csvs = sorted(directory.rglob("*.csv"))
    for path in csvs or sorted(directory.rglob("*.json")):
        body = path.read_bytes() if csvs else json.dumps(_decided(json.loads(path.read_text()))).encode()
        h.update(str(path.relative_to(directory)).encode() + b"\0" + body)
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="Lublin-model jobs (trace seed 1)")
    parser.add_argument("--remap-jobs", type=int, default=3_000, help="jobs of the remap replays' trace")
    parser.add_argument("--only", default="", help="comma list of run names (default: all)")
    parser.add_argument("--expect", type=Path, help="JSON line of an earlier run: exit 1 on any difference")
    args = parser.parse_args(argv)
    # `-m vjob.cli` from this checkout (not the installed entry point, which may be another
    # checkout's editable install): so a worktree of the old commit measures the old code.
    vjob = [sys.executable, "-m", "vjob.cli"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result: dict[str, str] = {}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vjob-digests-") as tmp:
        trace, remap_trace = Path(tmp) / "trace.swf", Path(tmp) / "remap.swf"
        for path, jobs in ((trace, args.jobs), (remap_trace, args.remap_jobs)):
            generate = [*vjob, "trace", "generate", *f"--nodes 256 --jobs {jobs} --seed 1 -o".split(), str(path)]
            subprocess.run(generate, check=True, stdout=subprocess.DEVNULL, env=env, cwd=REPO)
        chosen = [n for n in args.only.split(",") if n]
        for name, argv_ in runs(trace, remap_trace).items():
            if chosen and name not in chosen:
                continue
            out = Path(tmp) / name
            started = time.monotonic()
            subprocess.run(
                [*vjob, "simulate", *argv_, "--out", str(out)], check=True, stdout=subprocess.DEVNULL, env=env, cwd=REPO
            )
            result[name] = digest(out)
            print(f"{name}: {result[name][:16]}… ({time.monotonic() - started:.1f} s)", file=sys.stderr, flush=True)
    line = {
        "bench": "schedule_digests",
        "jobs": args.jobs,
        "remap_jobs": args.remap_jobs,
        "seconds": round(time.monotonic() - t0, 1),
        **result,
    }
    print(json.dumps(line))
    if args.expect:
        before = json.loads(args.expect.read_text().strip().splitlines()[-1])
        changed = sorted(k for k in result if before.get(k) != result[k])
        print(json.dumps({"changed": changed}))
        return 1 if changed else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
