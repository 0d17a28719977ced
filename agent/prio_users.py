"""`vjob prio --users`: each user's fair share as UBIS sees it, like Slurm's `sshare`.

Why beside `prio_cmd`: the per-job table answers "why does this job rank here"; this one answers
"what does my usage cost me" — the target, the decayed usage and the term they give
(ubis_priority.user_shares), in the same formats (table, json, csv).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, fields

from ubis_priority.user_shares import UserShare

HEADER = ["USER", "ACCOUNT", "TARGET", "USAGE (node-h)", "USAGE SHARE", "TERM", "WEIGHTED"]


def render_users(shares: list[UserShare], fmt: str) -> str:
    """One row per user (and account), the one the fair share holds back most first."""
    data = [asdict(s) for s in shares]
    if fmt == "json":
        return json.dumps({"users": data}, indent=2) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=[f.name for f in fields(UserShare)])
        writer.writeheader()
        writer.writerows(data)
        return buf.getvalue()
    lines = [HEADER]
    for s in shares:
        lines.append(
            [
                s.user,
                s.account or "-",
                f"{s.target:.4f}",
                f"{s.usage / 3600.0:.2f}",
                f"{s.usage_share:.4f}",
                f"{s.term:.4f}",
                f"{s.weighted:.4f}",
            ]
        )
    widths = [max(len(line[c]) for line in lines) for c in range(len(HEADER))]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() + "\n" for line in lines]
    note = "(TERM = (target - usage share + 1) / 2; WEIGHTED = TERM x the usage weight, added to each job's priority)\n"
    return "".join(out) + note


__all__ = ["render_users"]
