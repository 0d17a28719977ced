"""A VM's move between two hosts sharing nothing, against a plain rsync of the same bytes (issue 38).

Runs tests/test_two_hosts_slurm.py `--runs` times (each: an ordinary user's job saved on host A
by Slurm's SIGTERM, resumed on host B of `deploy/devcluster up --hosts 2`; the test measures the
pilot's copy-and-check and a plain rsync of the same files over the same link as the same user)
and prints each run's `two_hosts_move` line, then one summary line: the median of the pilot's
copy-and-check time over the plain rsync's, and over rsync + sha256 on arrival. Ratios, not
rates, for comparisons: this machine's 2 cores are shared. As root, under the dev cluster's lock:

    flock /tmp/vjob-devcluster.lock .venv/bin/python bench/two_hosts_move.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    figures = []
    load = os.getloadavg()[0]
    for _ in range(args.runs):
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/test_two_hosts_slurm.py"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        )
        lines = [line for line in done.stdout.splitlines() if '"figure": "two_hosts_move"' in line]
        if done.returncode != 0 or not lines:
            print(done.stdout[-3000:], file=sys.stderr)
            return 1
        figure = json.loads(lines[-1][lines[-1].index("{") :])
        figures.append(figure)
        print(json.dumps(figure), flush=True)
    summary = {
        "figure": "two_hosts_move_ratio",
        "runs": len(figures),
        "pilot_copy_time_over_plain_rsync": round(
            statistics.median(f["pilot_copy_checked_s"] / f["plain_rsync_s"] for f in figures), 2
        ),
        "pilot_copy_time_over_rsync_and_sha256": round(
            statistics.median(f["pilot_copy_checked_s"] / f["plain_rsync_and_sha256_s"] for f in figures), 2
        ),
        "load_1min": [round(load, 1), round(os.getloadavg()[0], 1)],
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
