"""`vjob --help` and `vjob COMMAND --help` wall time against `python -c pass` in the same run
(the interpreter's floor).

Why a ratio: the CI machine is shared; the goal (< 0.3 s on an idle machine, issues 22 and 36)
is read off the absolute figure, the ratio says how much vjob adds to a bare interpreter. One
JSON line per command, then one summing them up (the slowest, the commands at or over 0.3 s);
`--commands agent,status` measures only those.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vjob.cli import COMMANDS  # noqa: E402  (after the path: run from a checkout)

GOAL_S = 0.3
"""Every `--help` under this many seconds on an idle machine (issue 36)."""


def best_of(cmd: list[str], n: int = 5) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True, cwd=ROOT, timeout=60)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--commands", help="comma-separated commands (default: all, and `vjob --help`)")
    parser.add_argument("--runs", type=int, default=5, help="runs per command, the best kept (default 5)")
    args = parser.parse_args()
    names = args.commands.split(",") if args.commands else ["", *COMMANDS]
    floor = best_of([sys.executable, "-c", "pass"], args.runs)
    measured: dict[str, float] = {}
    for name in names:
        words = [name] if name else []
        help_s = best_of([sys.executable, "-m", "vjob.cli", *words, "--help"], args.runs)
        measured[name or "vjob"] = help_s
        print(
            json.dumps(
                {
                    "bench": "cli_help",
                    "command": name or "vjob",
                    "help_s": round(help_s, 3),
                    "python_s": round(floor, 3),
                    "ratio": round(help_s / floor, 2),
                }
            ),
            flush=True,
        )
    slowest = max(measured, key=measured.__getitem__)
    summary = {
        "bench": "cli_help_summary",
        "commands": len(measured),
        "slowest": slowest,
        "slowest_s": round(measured[slowest], 3),
        "python_s": round(floor, 3),
        "over_0_3_s": sorted(n for n, t in measured.items() if t >= GOAL_S),
    }
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
