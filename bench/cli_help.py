"""`vjob --help` wall time against `python -c pass` in the same run (the interpreter's floor).

Why a ratio: the CI machine is shared; the goal (< 0.3 s on an idle machine, issue 22) is read
off the absolute figure, the ratio says how much vjob adds to a bare interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def best_of(cmd: list[str], n: int = 7) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True, cwd=ROOT, timeout=60)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    floor = best_of([sys.executable, "-c", "pass"])
    help_s = best_of([sys.executable, "-m", "vjob.cli", "--help"])
    print(f"vjob --help: {help_s:.3f} s; bare interpreter: {floor:.3f} s")
    print(
        json.dumps(
            {
                "bench": "cli_help",
                "help_s": round(help_s, 3),
                "python_s": round(floor, 3),
                "ratio": round(help_s / floor, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
