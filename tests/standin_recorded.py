"""The Slurm stand-in printing the real 22.05 recording, for tests that run the agent's loop on it.

Why one helper: the tests that drive `Agent.run` against the stand-in (the collector's pace, the
wake through the JSON read's pace) need the same small cluster — the recorded `squeue --json`
jobs, their numeric listing lines, one recorded node — and a configuration pointing at it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from devkit.slurm_standin import SlurmStandIn, listing_line

FIXTURES = Path(__file__).parent / "data" / "fixtures" / "slurm"


def recorded_standin(tmp_path: Path) -> tuple[SlurmStandIn, dict[str, dict[str, Any]]]:
    """A stand-in in `tmp_path/bin` printing the 22.05 recording's jobs (by id) and one node,
    and `tmp_path/etc` for the slurm.conf the configuration names."""
    doc = json.loads((FIXTURES / "debian-22.05-squeue.json").read_text())
    standin = SlurmStandIn(tmp_path / "bin", version="22.05.8", meta=doc["meta"])
    jobs = {str(j["job_id"]): j for j in doc["jobs"]}
    standin.write_base((k, json.dumps(v, indent=2)) for k, v in jobs.items())
    standin.write_delta({})
    standin.write("listing.txt", "".join(listing_line(v) + "\n" for v in jobs.values()))
    node = json.loads((FIXTURES / "rivos_sinfo_out.json").read_text())["nodes"][0]
    standin.write("sinfo.json", json.dumps({"meta": doc["meta"], "errors": [], "nodes": [node]}))
    (tmp_path / "etc").mkdir()
    return standin, jobs
