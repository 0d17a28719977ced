"""The README's main command is a test (issue 32): `deploy/demo` end to end on the development
cluster with real debian12 guests, and every claim of its JSON line checked. Also the pieces
of devkit/demo_*.py that decide those claims, without the cluster.

Why run `deploy/demo` itself rather than the Scenario class: the command a newcomer types is
the one that must work (its set-up, its exit status, its one-line failures); the scenario's
code path is the same either way. It replaces the older test of this file that ran the demo's
job program on the host only: the demo compares every job's result with that very run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from devkit.demo_jobs import (
    REAL_LATENCY_FACTOR,
    REAL_MIN_S,
    REAL_PROGRAM,
    REAL_ROUNDS,
    REAL_STEPS,
    TINY_IMAGE,
    progress_steps_of,
    real_script,
    steps_around_resume,
)
from devkit.demo_outcome import START_RATIO_MAX, Outcome, Timeline, no_preemption_wait, remaining_run_s
from devkit.guest_probe import guest_panic
from vjob.pilot_files import PilotState, PilotStatus

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slurm
@pytest.mark.realvm
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_deploy_demo_checkpoints_real_jobs_for_an_interactive_job_and_says_so(
    slurm_cluster: object, libvirt_system: str
) -> None:
    """The demo's JSON claims, each checked: the interactive job took the nodes of at least two
    batch jobs by checkpointing them, they all resumed, nothing was computed twice, every
    result equals an uninterrupted run's, the agent recorded the snapshots and the nodes' OS,
    and the interactive job started within a quarter of the wait it would have had without
    preemption, that wait being measured in the same run (the batch jobs' remaining run time,
    devkit.demo_outcome.no_preemption_wait). Fails on a broken agent: victims 0."""
    # Not under pytest's tmp_path: QEMU runs as libvirt-qemu and must traverse to the VM disks.
    work = Path(tempfile.mkdtemp(prefix="vjob-demo-test-", dir="/var/tmp"))
    work.chmod(0o711)
    try:
        done = subprocess.run(
            [str(REPO / "deploy" / "demo"), "--work", str(work / "run"), "--plot", str(work / "timeline.png")],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=2300,
            check=False,
        )
        lines = done.stdout.strip().splitlines()
        said = f"stdout:\n{done.stdout[-3000:]}\nstderr (last lines):\n{done.stderr[-1500:]}"
        assert "Traceback" not in done.stderr, said
        assert lines and lines[-1].startswith("{"), said
        claim = json.loads(lines[-1])
        print(lines[-1])  # the run's figures, in the report of `pytest -rP`
        assert claim["image"] == "debian12", said
        assert claim["victims"] >= 2, said
        assert claim["resumed"] == claim["victims"], said
        assert claim["outputs_identical"] is True, said
        assert claim["work_lost_s"] == 0, said
        assert claim["snapshots_in_store"] >= claim["victims"], said
        assert claim["nodes_with_image"] > 0, said
        wait = claim["no_preemption_wait_s"]
        assert wait is not None and claim["interactive_start_s"] <= START_RATIO_MAX * wait, said
        assert done.returncode == 0, said
        assert sum("result.txt identical to an uninterrupted run" in line for line in lines) == 4, said
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_the_batch_script_is_ordinary_and_sized_from_its_submission() -> None:
    script = real_script("debian12", "vjob-demo-7", submitted_at=1700000000.25)
    assert script.startswith("#!/bin/bash\n#VJOB os=debian12\n") and "vjob run" not in script
    assert "python3 - 0.5 vjob-demo-7 1700000000.250 <<'PY'" in script


def test_the_jobs_span_follows_their_start_latency_and_never_changes_the_result(tmp_path: Path) -> None:
    """A quick variant of the demo's program (6 steps of 200 rounds, minimum 0.1 s): a job that
    started about 0.5 s after its submission spreads its steps over REAL_LATENCY_FACTOR x that; its result is the
    one computed without any span."""
    program = (
        REAL_PROGRAM.replace(f"range({REAL_ROUNDS})", "range(200)")
        .replace(f"range(1, {REAL_STEPS} + 1)", "range(1, 6 + 1)")
        .replace(f"/ {REAL_STEPS} -", "/ 6 -")
        .replace(str(REAL_MIN_S), "0.1")
    )
    results = []
    for submitted in (0.0, time.time() - 0.5):
        run = tmp_path / str(len(results))
        run.mkdir()
        done = subprocess.run(
            ["python3", "-", "0", "seed", f"{submitted:.3f}"],
            input=program,
            text=True,
            cwd=run,
            capture_output=True,
            timeout=120,
            check=True,
        )
        assert progress_steps_of(done.stdout.splitlines()) == [1, 2, 3, 4, 5, 6]
        results.append((run / "result.txt").read_text())
        words = done.stdout.splitlines()[0].split()  # started L s after submission: steps spread over S s
        latency, span = float(words[1]), float(words[-2])
        if submitted:
            assert latency >= 0.5 and abs(span - REAL_LATENCY_FACTOR * latency) <= 0.5, words
        else:
            assert (latency, span) == (0.0, 0.0), words
    assert results[0] == results[1] and len(results[0].strip()) == 64


def test_steps_around_the_resume(tmp_path: Path) -> None:
    out = tmp_path / "1.out"
    out.write_text(
        "start\nprogress 1/60 aa\nprogress 2/60 bb\nvjob: restoring VM vjob-slurm-1 locally on node1\n"
        "progress 3/60 cc\n"
    )
    assert steps_around_resume(out) == (2, 3)
    assert steps_around_resume(tmp_path / "missing.out") == (0, 0)


def _history(*moves: tuple[str, float]) -> list[dict[str, object]]:
    return [{"state": state, "at": at, "node": "node1"} for state, at in moves]


def test_the_remaining_run_time_leaves_out_the_time_spent_checkpointed() -> None:
    t0 = 1000.0
    untouched = _history(("starting", 900), ("running", 910), ("finished", 1080))
    assert remaining_run_s(untouched, t0) == 80
    victim = _history(
        ("running", 910),
        ("saving", 1002),
        ("saved", 1003),
        ("starting", 1020),
        ("restoring", 1021),
        ("running", 1030),
        ("finished", 1120),
    )
    assert remaining_run_s(victim, t0) == 120 - 28
    assert remaining_run_s(_history(("running", 910), ("saved", 1003)), t0) is None


def test_the_no_preemption_wait_is_the_end_of_as_many_jobs_as_the_interactive_job_needs() -> None:
    assert no_preemption_wait([80.0, 92.0, 40.0, 300.0], 2) == 80.0
    assert no_preemption_wait([80.0, 92.0, 40.0, 300.0], 1) == 40.0
    assert no_preemption_wait([80.0, None, 40.0, 300.0], 2) is None  # a job's end unknown: no claim
    assert no_preemption_wait([80.0], 2) is None


def _outcome(**changes: object) -> Outcome:
    base = Outcome(
        interactive_start_s=3.0,
        victims=["1", "2"],
        resumed=["1", "2"],
        local_resumes=2,
        work_lost_s=0.0,
        counters={},
        preempt_counts={},
        checkpoint_seconds={},
        timeline=Timeline(),
        image="debian12",
        outputs_identical=True,
        snapshots_in_store=2,
        nodes_with_image=4,
        no_preemption_wait_s=60.0,
    )
    for key, value in changes.items():
        setattr(base, key, value)
    return base


def test_the_outcome_names_each_claim_it_fails() -> None:
    assert _outcome().problems() == []
    assert _outcome(victims=[], resumed=[]).problems() == ["victims 0, want >= 2"]
    assert _outcome(resumed=["1"]).problems() == ["resumed 1 of 2 victims"]
    assert _outcome(snapshots_in_store=1).problems() == ["snapshots in the store 1 < victims 2"]
    assert _outcome(nodes_with_image=0).problems() == ["no node records debian12 as its OS"]
    assert _outcome(outputs_identical=False).problems() == [
        "a job's result or output differs from an uninterrupted run"
    ]
    assert _outcome(interactive_start_s=15.01).problems() == [
        "interactive start 15.01 s > 0.25 x the no-preemption wait 60.00 s"
    ]
    assert _outcome(no_preemption_wait_s=None).problems() == [
        "the no-preemption wait was not measured (a batch job's end is unknown)"
    ]
    tiny = _outcome(image=TINY_IMAGE, outputs_identical=None, nodes_with_image=0, no_preemption_wait_s=None)
    assert tiny.problems() == []
    assert json.loads(json.dumps(_outcome().json_line()))["no_preemption_wait_s"] == 60.0


def test_a_guests_kernel_panic_is_named(tmp_path: Path) -> None:
    """A member VM that panicked while booting (seen under TCG at load 8) is named at once."""
    (tmp_path / "vjob-slurm-3-0.console.log").write_text("VJOB-GUEST: sshd started\n")
    st = PilotStatus(
        job_id="3",
        vm="vjob-slurm-3-0",
        node="node5",
        uri="qemu:///system",
        state=PilotState.RUNNING,
        since=0.0,
        member_nodes=["node5", "node6"],
        console_log=str(tmp_path / "vjob-slurm-3-0.console.log"),
    )
    assert guest_panic(st) == ""
    (tmp_path / "vjob-slurm-3-1.console.log").write_text(
        "[ 0.04] ..MP-BIOS bug: 8254 timer not connected to IO-APIC\n"
        "[ 0.048000] Kernel panic - not syncing: IO-APIC + timer doesn't work!\n[ 0.05] CPU: 0\n"
    )
    assert (
        guest_panic(st)
        == 'VM vjob-slurm-3-1: kernel panic while booting: "Kernel panic - not syncing: IO-APIC + timer doesn\'t work!"'
    )
