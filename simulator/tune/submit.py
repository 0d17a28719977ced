"""`vjob tune run --submit slurm --array N`: the study's workers as one Slurm job array.

Why the environment carries the study: the batch script is a fixed text (this Python and
`vjob tune worker`); the study name and the database URL (which may hold a password) go to the
tasks as VJOB_TUNE_STUDY / VJOB_TUNE_STORAGE through sbatch's --export=ALL, never through a
shell string or an argv that `ps` shows. PBS (`qsub -J 0-N`) and OAR (`oarsub --array N`)
run the same worker the same way (docs/tune.md).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from plugins.slurm.config import SlurmConfig
from simulator.tune.study import STORAGE_ENV
from vjob.errors import InputError, UsageError
from vjob.proc import run
from vjob.secrets import mask_url

STUDY_ENV = "VJOB_TUNE_STUDY"
HEARTBEAT_ENV = "VJOB_TUNE_HEARTBEAT_S"


def worker_script() -> str:
    """The array task's script: the same interpreter as this command, then the worker."""
    return (
        "#!/bin/sh\n"
        "# vjob tune worker, one task of the array: the study and its database come from\n"
        f"# ${STUDY_ENV} and ${STORAGE_ENV} (sbatch --export=ALL)\n"
        f"exec {shlex.quote(sys.executable)} -m vjob.cli tune worker --no-progress\n"
    )


def require_server_storage(url: str) -> None:
    """Refuse a SQLite study for an array: its tasks run on many nodes at once, and a SQLite file
    shared by writers on several hosts is what Optuna's documentation advises against (SQLite
    locks the whole file, and its locks are not reliable on NFS: a lost lock corrupts the study,
    a held one stalls every task). Optuna's journal file storage was the other way out; it also
    leans on a lock file on the shared file system, and `vjob tune show/apply` and the workers'
    heartbeats would then need a second code path, so a database server it is."""
    if url.startswith("sqlite"):
        raise UsageError(
            f"--submit slurm: the study storage {mask_url(url)} is a SQLite file, which the array's "
            "tasks on many nodes would share (Optuna advises against it: file locks over NFS); give "
            "--storage a database server (e.g. postgresql://tune@db/tune, or $VJOB_TUNE_STORAGE), "
            "or run the workers on this host with --submit local"
        )


def submit_slurm(
    slurm: SlurmConfig, study: str, url: str, tasks: int, *, heartbeat_s: int, log_dir: Path, time_limit: str | None
) -> str:
    """Submit `tasks` workers of `study` as one array job; returns the Slurm job id."""
    require_server_storage(url)
    if not 1 <= tasks <= 10000:
        raise InputError(f"--array = {tasks}: must be in 1..10000 (tasks)")
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--log-dir {log_dir}: cannot create: {exc.strerror}") from None
    sbatch = str(Path(slurm.bin_dir) / "sbatch") if slurm.bin_dir else "sbatch"
    cmd = [
        sbatch,
        "--parsable",
        f"--array=0-{tasks - 1}",
        "--job-name=vjob-tune",
        "--export=ALL",
        f"--output={log_dir.resolve() / 'vjob-tune-%A_%a.out'}",
    ]
    if time_limit:
        cmd.append(f"--time={time_limit}")
    env = dict(os.environ) | {STUDY_ENV: study, STORAGE_ENV: url, HEARTBEAT_ENV: str(heartbeat_s)}
    if slurm.conf:
        env["SLURM_CONF"] = slurm.conf
    out = run(
        cmd,
        timeout_s=60,
        stdin=worker_script(),
        env=env,
        hint="is slurmctld up?",
        missing_hint="set [slurm] bin_dir or PATH",
    )
    return out.strip().split(";")[0]
