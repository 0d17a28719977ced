"""The demo's batch jobs: the real program, the scripts that run it, and reading what they printed.

Why apart from the scenario: the job is what the demo's claims are about (its result must
equal an uninterrupted run's, its output must hold every progress line once), so the program,
its pacing and the readers of its output live together, and the CI test
(tests/test_realjob_demo.py) checks them without a cluster.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

TINY_IMAGE = "debian-tiny"
"""The counter guest: `vjob run` in the script, its counters on the console."""
REAL_IMAGE = "debian12"
REAL_STEPS, REAL_ROUNDS, REAL_PACE_S = 60, 20_000, 0.5
"""The real job: 60 steps of 20,000 chained sha256 each, at least 0.5 s apart (about 45 s
under TCG on a quiet machine), spread over the span below."""
REAL_MIN_S, REAL_LATENCY_FACTOR = 45.0, 1.5
"""A real job spreads its steps over max(REAL_MIN_S, REAL_LATENCY_FACTOR x its start latency)
seconds, the latency being from its submission to its script's start, read on the guest's
clock (libvirt sets it from the host's, UTC). Why: the four jobs' guests boot together on the
same cores, so the last one starts after the first by a part of the start latency itself (2.5
to 7 s of 78-100 s in five runs at load 6-9 here; 155 against 235 s at load 12 in issue 32,
where a fixed 45 s of work ended before the last guest was up). The first job must outlive
that spread, three steps of the last one, the interactive job's switch and its victims'
resume: with 1.5 x its latency it does while the last start is within 2.4 x the first's less
20 s, the issue's case included; more would only lengthen the demo and its CI test (each 0.5 x
is about 50 s at load 6). The span changes the time the job takes, never its result."""
REAL_PROGRAM = f"""import hashlib, sys, time
pace, h, submitted = float(sys.argv[1]), sys.argv[2].encode(), float(sys.argv[3])
start = time.time()
latency = start - submitted if submitted else 0.0
span = max({REAL_MIN_S}, {REAL_LATENCY_FACTOR} * latency) if 0 < latency < 3600 else {REAL_MIN_S} if submitted else 0.0
print(f"started {{latency:.1f}} s after submission: steps spread over {{span:.0f}} s", flush=True)
for step in range(1, {REAL_STEPS} + 1):
    for _ in range({REAL_ROUNDS}):
        h = hashlib.sha256(h).digest()
    print(f"progress {{step}}/{REAL_STEPS} {{h.hex()[:12]}}", flush=True)
    time.sleep(max(pace, start + span * step / {REAL_STEPS} - time.time()))
open("result.txt", "w").write(h.hex() + "\\n")
"""
"""The job's computation; `python3 - PACE SEED SUBMITTED_AT` (SUBMITTED_AT 0: no span; the
pace and the span change the time, not the result)."""


def real_script(image: str, seed: str, pace_s: float = REAL_PACE_S, submitted_at: float = 0.0) -> str:
    """An ordinary batch script: nothing of vjob in it but the `#VJOB os=` line."""
    return (
        f"#!/bin/bash\n#VJOB os={image}\n"
        'echo "start on $(hostname) as $(id -un) in $(pwd)"\n'
        f"python3 - {pace_s} {seed} {submitted_at:.3f} <<'PY'\n{REAL_PROGRAM}PY\n"
    )


def uninterrupted_result(seed: str, scratch: Path) -> str:
    """result.txt of the same program run here, without a VM and without a pause."""
    scratch.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["python3", "-", "0", seed, "0"],
        input=REAL_PROGRAM,
        text=True,
        cwd=scratch,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return (scratch / "result.txt").read_text()


def progress_steps(output: Path) -> list[int]:
    """The step numbers of the `progress N/M` lines of a real job's output file, in order."""
    try:
        text = output.read_text(errors="replace")
    except OSError:
        return []
    return progress_steps_of(text.splitlines())


def progress_steps_of(lines: list[str]) -> list[int]:
    """The step numbers of the `progress N/M` lines among `lines`, in order (a repeat: a step computed twice)."""
    steps = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "progress" and parts[1].split("/")[0].isdigit():
            steps.append(int(parts[1].split("/")[0]))
    return steps


def steps_around_resume(output: Path) -> tuple[int, int]:
    """A real job's last progress step before its pilot's first "restoring VM" line, and the
    first one after (0 when there is none)."""
    try:
        lines = output.read_text(errors="replace").splitlines()
    except OSError:
        return 0, 0
    cut = next((k for k, line in enumerate(lines) if line.startswith("vjob: restoring VM")), len(lines))
    before = progress_steps_of(lines[:cut])
    after = progress_steps_of(lines[cut:])
    return (before[-1] if before else 0), (after[0] if after else 0)
