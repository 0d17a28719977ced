"""What a run measured: summary.json, jobs.csv, segments.csv, PNG plots and a terminal table.

Why these definitions (stated once, used everywhere):
- makespan: from the first submission to the last end;
- utilisation: useful node-seconds (runtime × nodes of every job, overheads excluded) over
  nodes × makespan; `busy_utilisation` counts the overheads (checkpoint, restart, OS swap) too;
- throughput: jobs finished per hour of makespan;
- wait: first start − submit; response: end − submit;
- bounded slowdown: response / max(runtime, 10 s), at least 1 (Feitelson's bound of 10 s);
- wasted node-seconds: node-seconds held without computing (checkpoint writes, resumes, OS
  swaps); a VM checkpoint loses no computed work, so this is the whole cost of preemption;
- admitted interactive wait (`interactive_admitted`): the interactive jobs that ran within
  the cap, each counting the time it was queued while the cap had room for it, up to its
  start (`Result.fit_wait`) — the time the policy itself made it wait (victims'
  checkpoints, a guard's refusal), without the time spent waiting for room under the cap
  (before it first fitted, and again after another interactive job took the room), which
  `interactive_within_cap_mean_wait_s` (from submission) includes;
- batch size classes (`batch_by_size`): small ≤ 1/32 of the machine, medium ≤ 1/4, large
  > 1/4 — the reproduction found large jobs hurt most, and a mean over all hides them.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from simulator.replay import Result

BOUND_S = 10.0


def _class_stats(wait: np.ndarray, response: np.ndarray, runtime: np.ndarray) -> dict[str, float | int]:
    if wait.size == 0:
        return {"count": 0}
    slowdown = np.maximum(1.0, response / np.maximum(runtime, BOUND_S))
    return {
        "count": int(wait.size),
        "mean_wait_s": float(wait.mean()),
        "median_wait_s": float(np.median(wait)),
        "p95_wait_s": float(np.quantile(wait, 0.95)),
        "mean_response_s": float(response.mean()),
        "mean_bounded_slowdown": float(slowdown.mean()),
    }


SIZE_CLASSES = (("small", 1 / 32), ("medium", 1 / 4), ("large", math.inf))
"""Batch size classes: (name, largest share of the machine's nodes)."""


def batch_by_size(result: Result) -> dict[str, dict[str, float | int]]:
    """Finished batch jobs per size class: count, mean and max wait, mean response (s)."""
    w = result.workload
    nodes = result.model.nodes
    done = ~w.interactive & ~np.isnan(result.end)
    wait = result.first_start - w.submit
    response = result.end - w.submit
    out: dict[str, dict[str, float | int]] = {}
    low = 0.0
    for name, share in SIZE_CLASSES:
        m = done & (w.nodes > low) & (w.nodes <= share * nodes)
        low = share * nodes
        if not m.any():
            out[name] = {"count": 0}
            continue
        out[name] = {
            "count": int(m.sum()),
            "mean_wait_s": float(wait[m].mean()),
            "mean_response_s": float(response[m].mean()),
            "max_wait_s": float(wait[m].max()),
        }
    return out


def summary(result: Result, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The summary.json document of one run."""
    w = result.workload
    nodes = result.model.nodes
    finished = ~np.isnan(result.end)
    start = float(w.submit.min()) if len(w) else 0.0
    makespan = float(np.nanmax(result.end) - start) if finished.any() else 0.0
    work = float(np.sum(w.runtime * w.nodes))
    overhead = float(np.sum(result.overhead_s * w.nodes))
    wait = result.first_start - w.submit
    response = result.end - w.submit
    by_class = {}
    for name, mask in (("interactive", w.interactive), ("batch", ~w.interactive)):
        m = mask & finished
        by_class[name] = _class_stats(wait[m], response[m], w.runtime[m])
    doc: dict[str, Any] = {
        "policy": result.policy,
        "nodes": nodes,
        "jobs": len(w),
        "finished": int(finished.sum()),
        "makespan_s": makespan,
        "throughput_jobs_per_hour": float(finished.sum() / (makespan / 3600.0)) if makespan > 0 else 0.0,
        "utilization": work / (nodes * makespan) if makespan > 0 else 0.0,
        "busy_utilization": (work + overhead) / (nodes * makespan) if makespan > 0 else 0.0,
        "preemptions": result.preemptions,
        "preempted_jobs": int(np.sum(result.preempt_count > 0)),
        "checkpoint_bytes": result.checkpoint_bytes,
        "remote_resumes": result.remote_resumes,
        "wasted_node_seconds": overhead,
        "os_swaps": result.os_swaps,
        "interactive_within_cap": int(np.sum(result.ran_privileged)),
        "max_interactive_nodes": result.max_interactive_held,
        "by_class": by_class,
        "batch_by_size": batch_by_size(result),
        "interactive_within_cap_mean_wait_s": _mean(wait[w.interactive & result.ran_privileged & finished]),
        "interactive_admitted": admitted(result),
        "model": {
            "os_count": result.model.os_count,
            "os_swap_s": result.model.os_swap_s,
            "bandwidth_mb_s": result.model.bandwidth_mb_s,
            "memory_mb_per_node": result.model.memory_mb_per_node,
            "backfill_depth": result.model.backfill_depth,
            "priority_refresh_s": result.model.priority_refresh_s,
        },
        "skipped": w.skipped,
        "engine": {"events": result.events, "passes": result.passes},
    }
    if extra:
        doc.update(extra)
    return doc


def admitted(result: Result) -> dict[str, float | int | None]:
    """The interactive jobs that ran within the cap, their wait while the cap had room for
    them (`Result.fit_wait`): count, mean, 95th percentile, largest, and the share that
    waited at most 60 s (the issue's goal: admitted within the cap, they wait only for their
    victims' checkpoints)."""
    w = result.workload
    m = w.interactive & result.ran_privileged & np.isfinite(result.end)
    wait = result.fit_wait[m]
    if not wait.size:
        return {"count": 0, "mean_wait_s": None, "p95_wait_s": None, "max_wait_s": None, "within_60s": None}
    return {
        "count": int(wait.size),
        "mean_wait_s": float(wait.mean()),
        "p95_wait_s": float(np.quantile(wait, 0.95)),
        "max_wait_s": float(wait.max()),
        "within_60s": float(np.mean(wait <= 60.0)),
    }


def schedule_digest(result: Result) -> str:
    """SHA-256 of everything a replay decided (each job's first start, end, preemptions,
    overhead, whether it ran within the cap, and every run segment): two code paths that
    must schedule alike are compared by it (bench/simulate.py)."""
    h = hashlib.sha256()
    for a in (result.first_start, result.end, result.preempt_count, result.overhead_s, result.ran_privileged):
        h.update(np.ascontiguousarray(a).tobytes())
    h.update(repr(result.segments).encode())
    return h.hexdigest()


def _mean(values: np.ndarray) -> float | None:
    """The mean, or None for no values (JSON null rather than NaN)."""
    return float(values.mean()) if values.size else None


def write_jobs_csv(result: Result, path: Path) -> None:
    w = result.workload
    with path.open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(
            ["job_id", "class", "submit", "first_start", "end", "nodes", "runtime", "preemptions", "os", "overhead_s"]
        )
        for i in range(len(w)):
            out.writerow(
                [
                    int(w.job_id[i]),
                    "interactive" if w.interactive[i] else "batch",
                    _num(w.submit[i]),
                    _num(result.first_start[i]),
                    _num(result.end[i]),
                    int(w.nodes[i]),
                    _num(w.runtime[i]),
                    int(result.preempt_count[i]),
                    int(max(w.os[i], 0)),
                    _num(result.overhead_s[i]),
                ]
            )


def write_segments_csv(result: Result, path: Path) -> None:
    ids = result.workload.job_id
    with path.open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["job_id", "start", "end", "nodes"])
        for j, start, end, nodes in sorted(result.segments, key=lambda s: (s[1], s[0])):
            out.writerow([int(ids[j]), _num(start), _num(end), nodes])


def _num(x: float) -> str:
    """Seconds as written in the CSVs: integers without '.0', else 3 decimals."""
    if x != x:  # NaN: never happened
        return ""
    return str(int(x)) if float(x).is_integer() else f"{x:.3f}"


def busy_timeline(result: Result, bins: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """(bin start times, mean busy nodes in each bin) from the run segments."""
    if not result.segments:
        return np.zeros(1), np.zeros(1)
    seg = np.array([(s, e, n) for _, s, e, n in result.segments], dtype=np.float64)
    t0, t1 = float(seg[:, 0].min()), float(seg[:, 1].max())
    edges = np.linspace(t0, max(t1, t0 + 1.0), bins + 1)
    width = edges[1] - edges[0]
    busy = np.zeros(bins)
    for s, e, n in seg:
        lo, hi = np.searchsorted(edges, [s, e], side="right") - 1
        lo, hi = max(lo, 0), min(hi, bins - 1)
        if lo == hi:
            busy[lo] += n * (e - s)
            continue
        busy[lo] += n * (edges[lo + 1] - s)
        busy[lo + 1 : hi] += n * width
        busy[hi] += n * (e - edges[hi])
    return edges[:-1], busy / width


def write_plots(result: Result, out: Path, bins: int = 400) -> list[Path]:
    """Utilisation over time, throughput over time, response-time CDF per class (PNG, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths: list[Path] = []
    days = 86400.0
    t, busy = busy_timeline(result, bins)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot(t / days, busy / result.model.nodes, lw=0.8)
    ax.set(xlabel="day", ylabel="busy nodes / nodes", title=f"Utilisation over time ({result.policy})", ylim=(0, 1.05))
    paths.append(_save(fig, out / "utilization.png"))

    ends = np.sort(result.end[~np.isnan(result.end)])
    fig, ax = plt.subplots(figsize=(8, 3.5))
    if ends.size:
        edges = np.linspace(0.0, ends[-1], bins + 1)
        counts, _ = np.histogram(ends, edges)
        hours = (edges[1] - edges[0]) / 3600.0
        ax.plot(edges[:-1] / days, counts / hours, lw=0.8)
    ax.set(xlabel="day", ylabel="jobs finished per hour", title=f"Throughput over time ({result.policy})")
    paths.append(_save(fig, out / "throughput.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    w = result.workload
    for name, mask in (("interactive", w.interactive), ("batch", ~w.interactive)):
        resp = np.sort((result.end - w.submit)[mask & ~np.isnan(result.end)])
        if resp.size:
            ax.plot(np.maximum(resp, 1.0), np.arange(1, resp.size + 1) / resp.size, label=name)
    ax.set(xscale="log", xlabel="response time (s)", ylabel="fraction of jobs", title="Response time CDF")
    ax.legend()
    paths.append(_save(fig, out / "response_cdf.png"))
    return paths


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def write_all(result: Result, out: Path, extra: dict[str, Any] | None = None, plots: bool = True) -> dict[str, Any]:
    """summary.json, jobs.csv, segments.csv and the plots in `out`; returns the summary."""
    out.mkdir(parents=True, exist_ok=True)
    doc = summary(result, extra)
    (out / "summary.json").write_text(json.dumps(doc, indent=2) + "\n")
    write_jobs_csv(result, out / "jobs.csv")
    write_segments_csv(result, out / "segments.csv")
    if plots:
        write_plots(result, out)
    return doc


def table_rows(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(metric, value) rows for the terminal table."""
    rows = [
        ("policy", doc["policy"]),
        ("jobs / nodes", f"{doc['jobs']} / {doc['nodes']}"),
        ("makespan", f"{doc['makespan_s'] / 86400:.1f} days"),
        ("throughput", f"{doc['throughput_jobs_per_hour']:.2f} jobs/h"),
        ("utilisation", f"{doc['utilization']:.3f}"),
        ("preemptions", str(doc["preemptions"])),
        ("checkpointed", f"{doc['checkpoint_bytes'] / 2**40:.2f} TiB"),
        ("wasted node-hours", f"{doc['wasted_node_seconds'] / 3600:.0f}"),
        ("OS swaps", str(doc["os_swaps"])),
    ]
    for name, stats in doc["by_class"].items():
        if stats.get("count"):
            rows.append(
                (
                    f"{name} ({stats['count']})",
                    f"wait mean {stats['mean_wait_s']:.0f} s, median {stats['median_wait_s']:.0f} s, "
                    f"p95 {stats['p95_wait_s']:.0f} s; slowdown {stats['mean_bounded_slowdown']:.1f}",
                )
            )
    adm = doc.get("interactive_admitted") or {}
    if adm.get("count"):
        rows.append(
            (
                f"admitted within the cap ({adm['count']})",
                f"wait from fitting mean {adm['mean_wait_s']:.0f} s, p95 {adm['p95_wait_s']:.0f} s, "
                f"{adm['within_60s']:.0%} within 60 s",
            )
        )
    return rows
