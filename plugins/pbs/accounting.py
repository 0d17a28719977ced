"""The VMs' usage of a PBS job, for the OpenPBS hook to put into `resources_used`.

Why a file and not the job's record directly: PBS lets only a hook change `resources_used`
(qalter cannot), and the hook runs in PBS's own Python without vjob. So root's side on the node
(a root pilot, pilot.usage) adds each run's figures to `<state_dir>/<job>.usage` — one
`vjob-usage@<node>:...` word per node, as vjob.usage_record writes it, 0600 root — and the
hook's execjob_epilogue (plugins/pbs/openpbs_hook.py, on the same MoM) reads it into the
custom resources `vjob_cpu_s` and `vjob_peak_mem` of the job's `resources_used`; execjob_end
removes it. `state_dir` must be the hook's (`/var/spool/pbs/vjob` by default).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from plugins.pbs.names import job_id as check_job_id
from vjob import usage_record
from vjob.errors import InputError
from vjob.usage_record import Usage

STATE_DIR = Path("/var/spool/pbs/vjob")
"""The hook's default `state_dir`."""


class PbsUsageWriter:
    """Adds one run's usage on one node to the job's usage file (root only)."""

    rms = "pbs"

    def __init__(self, state_dir: Path = STATE_DIR) -> None:
        self.state_dir = Path(state_dir)

    def path(self, job: str) -> Path:
        return self.state_dir / f"{check_job_id(job)}.usage"

    def add(self, job: str, node: str, run: Usage) -> str:
        """Merge `run` into `node`'s word of the job's file, under a lock; the file's text after."""
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.path(job)
        lock_fd = os.open(self.state_dir / ".usage.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            text = self._read(path)
            new = usage_record.merged(text, node, run)
            tmp = path.with_name(path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(new + "\n")
            tmp.replace(path)
            return new
        finally:
            os.close(lock_fd)

    @staticmethod
    def _read(path: Path) -> str:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return ""
        with os.fdopen(fd) as fh:
            text = fh.read(usage_record.MAX_FIELD_CHARS + 1)
        if len(text) > usage_record.MAX_FIELD_CHARS:
            raise InputError(f"{path}: more than {usage_record.MAX_FIELD_CHARS} characters: not a usage file")
        return text.strip()
