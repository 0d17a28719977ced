"""Issue 34 item 5 on the 100,000-job grid: each candidate vjob variant against today's vjob,
cell by cell, as a table (markdown) and a plot of the front per cell (docs/policy.md).

Why a script: the issue's test is per cell and strict — a lower mean admitted interactive
wait with batch response, large-batch response and utilisation no worse, means of the same
seeds — and the plot puts each variant's admitted wait beside its batch response × MMS, so
the trade shows where it is made. Reads policy_grid.py's JSON lines (today's vjob and MMS from
one file, the candidates, labelled by variant, from another):

    .venv/bin/python docs/ubis-reproduction/policy_front.py \\
        --today docs/ubis-reproduction/policy-grid-100k.jsonl \\
        --candidates docs/ubis-reproduction/policy-tier-candidates-100k.jsonl \\
        --table "UBIS in the interactive tier" --png docs/policy/front-100k.png

Ends with one line of JSON: per candidate, the cells met strictly and with the tolerance.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

Cell = tuple[float, float, float]
BySeed = dict[Cell, dict[int, dict[str, Any]]]
TOLERANCE = {"batch": 0.01, "large": 0.01, "util": 0.001}
"""The looser reading of "no worse", reported beside the strict one (docs/policy.md says why)."""


def figures(line: dict[str, Any]) -> dict[str, float | None]:
    adm = line.get("interactive_admitted") or {}  # MMS's and UBIS's lines of older runs lack it
    return {
        "admitted": adm.get("mean_wait_s"),
        "within_60s": adm.get("within_60s"),
        "batch": line["batch_mean_response_s"],
        "large": line["batch_by_size"]["large"]["mean_response_s"],
        "util": line["utilization"],
        "interactive": line["interactive_mean_wait_s"],
        "within_cap": line["interactive_within_cap_mean_wait_s"],
        "preemptions": line["preemptions"],
    }


def load(path: Path, policy: str | None = None) -> dict[str, dict[Cell, dict[int, dict[str, Any]]]]:
    """label → cell → seed → figures, from JSON lines (only `policy`'s lines when given)."""
    out: dict[str, dict[Cell, dict[int, dict[str, Any]]]] = defaultdict(lambda: defaultdict(dict))
    for text in path.read_text().splitlines():
        line = json.loads(text)
        if line.get("cap_mode", "preempt") != "preempt" or (policy and line["policy"] != policy):
            continue
        out[line["label"]][(line["frac"], line["size"], line["cap"])][line["seed"]] = figures(line)
    return out


def mean(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows]
    return None if any(v is None for v in values) else statistics.fmean(values)


def compare(today: BySeed, mms: BySeed, cand: BySeed) -> list[dict[str, Any]]:
    """Per cell (seeds both ran): today's and the candidate's means, MMS's batch response, and
    whether the cell improves strictly / within TOLERANCE (None: no admitted job in the cell)."""
    rows = []
    for cell in sorted(cand):
        seeds = sorted(set(cand[cell]) & set(today[cell]) & set(mms[cell]))
        if not seeds:
            continue
        a = {k: mean([today[cell][s] for s in seeds], k) for k in today[cell][seeds[0]]}
        b = {k: mean([cand[cell][s] for s in seeds], k) for k in today[cell][seeds[0]]}
        m = {k: mean([mms[cell][s] for s in seeds], k) for k in ("batch", "large")}
        strict = loose = None
        if a["admitted"] is not None:
            lower = b["admitted"] < a["admitted"]
            strict = lower and b["batch"] <= a["batch"] and b["large"] <= a["large"] and b["util"] >= a["util"]
            loose = (
                lower
                and b["batch"] <= a["batch"] * (1 + TOLERANCE["batch"])
                and b["large"] <= a["large"] * (1 + TOLERANCE["large"])
                and b["util"] >= a["util"] - TOLERANCE["util"]
            )
        rows.append({"cell": cell, "seeds": seeds, "today": a, "cand": b, "mms": m, "strict": strict, "loose": loose})
    return rows


def table(label: str, rows: list[dict[str, Any]]) -> str:
    """The markdown table of docs/policy.md for one candidate."""
    head = (
        f"| cell | admitted wait (s): today / {label} | ≤ 60 s | batch ×MMS: today / new | "
        "large ×MMS: today / new | utilisation: today / new | interactive wait (s): today / new | strict | ≤ 1 % |"
    )
    out = [head, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        a, b, m = r["today"], r["cand"], r["mms"]
        if a["admitted"] is None:
            continue
        f, size, cap = r["cell"]
        out.append(
            f"| {f:.0%}/{size:.0f}/{cap:.0%} | {a['admitted']:,.0f} / {b['admitted']:,.0f} "
            f"| {a['within_60s']:.0%} / {b['within_60s']:.0%} "
            f"| {a['batch'] / m['batch']:.3f} / {b['batch'] / m['batch']:.3f} "
            f"| {a['large'] / m['large']:.3f} / {b['large'] / m['large']:.3f} "
            f"| {a['util']:.4f} / {b['util']:.4f} | {a['interactive']:,.0f} / {b['interactive']:,.0f} "
            f"| {'yes' if r['strict'] else 'no'} | {'yes' if r['loose'] else 'no'} |"
        )
    return "\n".join(out)


def summary_table(summary: dict[str, dict[str, Any]]) -> str:
    """One markdown row per candidate: cells met (strict, within TOLERANCE), the admitted
    mean, the ranges over the cells, the target's cells."""
    out = [
        "| variant | cells met, strict / within 1 % (of 12) | admitted wait, mean of 12 cells (s; today 1,566) "
        "| batch ×MMS | large ×MMS | share ≤ 60 s | target cells |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, s in summary.items():
        out.append(
            f"| {label} | {s['met_strict']} / {s['met_within_1pct']} | {s['admitted_wait_mean_s'][1]:,} "
            f"| {s['batch_x_mms'][0]:.2f}–{s['batch_x_mms'][1]:.2f} "
            f"| {s['large_x_mms'][0]:.2f}–{s['large_x_mms'][1]:.2f} "
            f"| {s['within_60s'][0]:.0%}–{s['within_60s'][1]:.0%} | {s['target_cells']} |"
        )
    return "\n".join(out)


def plot(today: BySeed, mms: BySeed, cands: dict[str, BySeed], png: Path) -> None:
    """One panel per cell with admitted jobs: admitted wait (x) against batch response × MMS
    (y), today's vjob and each candidate (mean of the seeds), the 1.10 line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [c for c in sorted(today) if mean(list(today[c].values()), "admitted") is not None]
    fig, axes = plt.subplots(3, 4, figsize=(16, 12), squeeze=False)
    markers = "osD^v<>pP*XhH8d"
    colours = plt.get_cmap("tab20").colors
    for ax, cell in zip(axes.flat, cells, strict=False):
        for k, (label, lines) in enumerate([("today", today), *cands.items()]):
            rows = compare(today, mms, {cell: lines.get(cell, {})})
            if not rows:
                continue
            r = rows[0]
            side = r["today"] if label == "today" else r["cand"]
            ax.scatter(
                side["admitted"],
                side["batch"] / r["mms"]["batch"],
                marker=markers[k % len(markers)],
                color=colours[(2 * k) % 20 + (2 * k) // 20],
                s=60 if label == "today" else 40,
                label=label,
                zorder=3 if label == "today" else 2,
            )
        ax.axhline(1.10, color="grey", lw=0.8, ls="--")
        f, size, cap = cell
        ax.set_title(f"{f:.0%} interactive, size {size:.0f}, cap {cap:.0%}", fontsize=9)
        ax.set_xlabel("admitted interactive wait (s)", fontsize=8)
        ax.set_ylabel("batch response × MMS", fontsize=8)
        ax.tick_params(labelsize=7)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=9)
    fig.suptitle(
        "vjob variants on the 100,000-job Lublin grid (mean of seeds 1-3): lower-left is better; "
        "dashed: the 1.10 × MMS goal",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0.1, 1, 0.97))
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--today", required=True, help="policy_grid.py lines with today's vjob and mms")
    parser.add_argument("--candidates", required=True, help="policy_grid.py lines of the candidate variants")
    parser.add_argument("--table", default="", help="print the markdown table of this candidate label")
    parser.add_argument("--png", default="", help="write the front per cell here")
    parser.add_argument("--summary", action="store_true", help="print one markdown row per candidate")
    args = parser.parse_args()
    base = load(Path(args.today))
    today, mms = base["vjob"], base["mms"]
    cands = {k: v for k, v in load(Path(args.candidates), "vjob").items()}
    summary = {}
    for label, lines in cands.items():
        rows = [r for r in compare(today, mms, lines) if r["strict"] is not None]
        before = [r["today"]["admitted"] for r in rows]
        after = [r["cand"]["admitted"] for r in rows]
        summary[label] = {
            "cells_with_admitted_jobs": len(rows),
            "met_strict": sum(bool(r["strict"]) for r in rows),
            "met_within_1pct": sum(bool(r["loose"]) for r in rows),
            "admitted_wait_mean_s": [round(statistics.fmean(before)), round(statistics.fmean(after))] if rows else None,
            "batch_x_mms": [
                round(min(r["cand"]["batch"] / r["mms"]["batch"] for r in rows), 3),
                round(max(r["cand"]["batch"] / r["mms"]["batch"] for r in rows), 3),
            ]
            if rows
            else None,
            "large_x_mms": [
                round(min(r["cand"]["large"] / r["mms"]["large"] for r in rows), 3),
                round(max(r["cand"]["large"] / r["mms"]["large"] for r in rows), 3),
            ]
            if rows
            else None,
            "within_60s": [
                round(min(r["cand"]["within_60s"] for r in rows), 3),
                round(max(r["cand"]["within_60s"] for r in rows), 3),
            ]
            if rows
            else None,
            "target_cells": sum(
                r["cand"]["within_60s"] >= 0.95 and r["cand"]["batch"] <= 1.10 * r["mms"]["batch"] for r in rows
            ),
        }
    if args.summary:
        print(summary_table(summary))
    if args.table:
        print(table(args.table, compare(today, mms, cands[args.table])))
    if args.png:
        plot(today, mms, cands, Path(args.png))
    print(json.dumps({"bench": "policy_front", "today": args.today, "candidates": summary}))


if __name__ == "__main__":
    main()
