"""`vjob simulate --subclusters FILE --remap none,arrive-f`: the heterogeneous replay, compared.

Why one command runs both: ARRIVE-F's claims are relative to the baseline on the same stream,
so each seed replays the same jobs (same kinds, same arrivals) under every --remap given, and
the summary states the change against `none` per figure, as the paper does. `--policy` is the
scheduler under the remapping: fcfs-easy (the paper's baseline, the default here) or vjob
(interactive jobs, `--interactive-frac` of the stream drawn per seed, preempt batch ones by
checkpoint at `--bandwidth-mb-s`); any other policy is refused, not silently replaced.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, cast

import numpy as np

from preemption.remap.policy import RemapParams
from simulator.remap_engine import REMAP_POLICIES, REMAPS, Remap, RemapResult, remap_policy, simulate
from simulator.remap_jobs import jobs_from_workload
from simulator.subclusters import Farm, load_farm
from simulator.workload import Workload
from vjob.cli import load_config
from vjob.config import RemapConfig
from vjob.errors import InputError
from vjob.progress import Progress

FIGURES = ("throughput_jobs_h", "makespan_s", "mean_wait_s", "mean_turnaround_s")


def params_from(cfg: RemapConfig) -> RemapParams:
    return RemapParams(
        beta=cfg.beta,
        tau_s=cfg.tau_s,
        threshold_s=cfg.threshold_s,
        max_migrations=cfg.max_migrations,
        thrash_pages_s=cfg.thrash_pages_s,
    )


def remaps_from(text: str) -> list[str]:
    out = [p.strip() for p in text.split(",")]
    for p in out:
        if p not in REMAPS:
            raise InputError(f"--remap = {p[:40]!r}: must be one of {', '.join(REMAPS)}")
    return list(dict.fromkeys(out))


def policy_from(text: str | None) -> str:
    """--policy with --subclusters: one of REMAP_POLICIES; unset is the paper's baseline."""
    policy = (text or "fcfs-easy").strip()
    if policy not in REMAP_POLICIES:
        known = ", ".join(sorted(REMAP_POLICIES))
        raise InputError(f"--policy = {policy[:40]!r}: with --subclusters it must be one of {known}")
    return policy


def interactive_frac(text: str) -> float:
    try:
        frac = float(text)
    except ValueError:
        frac = -1.0
    if not 0.0 <= frac <= 1.0:
        raise InputError(f"--interactive-frac = {str(text)[:40]!r}: with --subclusters one share in 0..1")
    return frac


def interactive_flags(n: int, frac: float, seed: int) -> np.ndarray:
    """Which jobs of a seed's stream are interactive: each with probability `frac` (seeded)."""
    return np.random.default_rng([seed, 20]).random(n) < frac


def compare(
    farm: Farm,
    workload: Workload,
    remaps: list[str],
    seeds: list[int],
    cfg: RemapConfig,
    *,
    label: str = "remap",
    policy: str = "fcfs-easy",
    frac: float = 0.0,
    checkpoint_mb_s: float = 500.0,
) -> dict[str, Any]:
    """Every (seed, remap) run on the same jobs per seed; means and changes against `none`."""
    params = params_from(cfg)
    preempts = remap_policy(policy).preempts
    runs: list[dict[str, Any]] = []
    with Progress(len(remaps) * len(seeds), label) as progress:
        for seed in seeds:
            jobs = jobs_from_workload(workload, farm, seed)
            inter = interactive_flags(len(jobs.submit), frac, seed) if preempts else None
            for remap in remaps:
                result: RemapResult = simulate(
                    farm,
                    jobs,
                    cast(Remap, remap),
                    params,
                    seed=seed,
                    migrate_bandwidth_mb_s=cfg.migrate_bandwidth_mb_s,
                    policy=policy,
                    interactive=inter,
                    checkpoint_mb_s=checkpoint_mb_s,
                )
                runs.append({"seed": seed, **result.summary()})
                progress.advance()
    mean = {
        r: {f: float(np.mean([x[f] for x in runs if x["remap"] == r])) for f in (*FIGURES, "migrations")}
        for r in remaps
    }
    doc: dict[str, Any] = {"jobs": len(workload), "seeds": seeds, "policy": policy, "runs": runs, "mean": mean}
    if "none" in mean:
        doc["change_pct_vs_none"] = {
            r: {f: 100.0 * (m[f] / mean["none"][f] - 1.0) if mean["none"][f] else 0.0 for f in FIGURES}
            for r, m in mean.items()
            if r != "none"
        }
    return doc


def simulate_remap(args: argparse.Namespace, workload: Workload, seeds: list[int]) -> int:
    farm = load_farm(args.subclusters)
    remaps = remaps_from(args.remap)
    policy = policy_from(args.policy)
    frac = interactive_frac(args.interactive_frac)
    if args.max_jobs:
        workload = workload.take(slice(0, args.max_jobs))
    cfg = load_config(args).remap
    doc = compare(farm, workload, remaps, seeds, cfg, policy=policy, frac=frac, checkpoint_mb_s=args.bandwidth_mb_s)
    doc |= {"subclusters": str(args.subclusters), "trace": args.trace}
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "remap_summary.json").write_text(json.dumps(doc, indent=2) + "\n")
    except OSError as exc:
        raise InputError(f"--out {out}: cannot write: {exc.strerror}") from None
    if getattr(args, "json", False):
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        _print(doc)
    return 0


def _print(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"heterogeneous replay ({doc['policy']}): {doc['jobs']} jobs, seeds {doc['seeds']}")
    table.add_column("remap")
    for f in (*FIGURES, "migrations"):
        table.add_column(f, justify="right")
    for r, m in doc["mean"].items():
        change = doc.get("change_pct_vs_none", {}).get(r, {})
        cells = [f"{m[f]:,.1f}" + (f" ({change[f]:+.1f} %)" if f in change else "") for f in FIGURES]
        table.add_row(r, *cells, f"{m['migrations']:.0f}")
    Console().print(table)
