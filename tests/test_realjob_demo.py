"""The demo's real job (devkit/demo.py, issue 15 item 7) without the cluster: the batch script
is an ordinary one and computes what the uninterrupted reference computes; the output readers
see every progress step and where the resume happened. The whole scenario runs in
`deploy/demo` (docs/slurm-agent.md quotes a run)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from devkit.demo import REAL_STEPS, progress_steps, real_script, steps_around_resume, uninterrupted_result


def test_the_batch_script_is_ordinary_and_computes_the_reference(tmp_path: Path) -> None:
    script = real_script("debian12", "vjob-demo-7", pace_s=0)
    assert script.startswith("#!/bin/bash\n#VJOB os=debian12\n") and "vjob run" not in script
    job = tmp_path / "job"
    job.mkdir()
    (job / "job.sh").write_text(script)
    done = subprocess.run(["bash", "job.sh"], cwd=job, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    (job / "out").write_text(done.stdout)
    assert progress_steps(job / "out") == list(range(1, REAL_STEPS + 1))
    want = uninterrupted_result("vjob-demo-7", tmp_path / "ref")
    assert (job / "result.txt").read_text() == want and len(want.strip()) == 64
    assert uninterrupted_result("vjob-demo-8", tmp_path / "ref8") != want


def test_steps_around_the_resume(tmp_path: Path) -> None:
    out = tmp_path / "1.out"
    out.write_text("start\nprogress 1/60 aa\nprogress 2/60 bb\nvjob: restoring VM vjob-slurm-1 locally on node1\n"
                   "progress 3/60 cc\n")  # fmt: skip
    assert steps_around_resume(out) == (2, 3)
    assert steps_around_resume(tmp_path / "missing.out") == (0, 0)
