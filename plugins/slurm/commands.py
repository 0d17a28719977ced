"""Running Slurm's client commands: argument lists, a timeout, and errors naming the command.

Why one runner: every call from the adapter, the development cluster and the tests must fail
the same way — a CommandError naming the command, the job it concerned and Slurm's own
message — and must never hang the agent when slurmctld is slow or gone.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from vjob import proc
from vjob.errors import CommandError, InputError

# A Slurm job id as vjob passes it to scontrol: 123, an array task 123_4, a het component 123+1.
_JOB_ID = re.compile(r"[0-9]{1,10}(?:_[0-9]{1,10}|\+[0-9]{1,4})?")


def check_job_id(job_id: str) -> str:
    """The job id unchanged when it is a Slurm job id, else InputError naming it."""
    if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):
        raise InputError(f"job id {str(job_id)[:40]!r}: not a Slurm job id (digits, optionally _TASK or +OFFSET)")
    return job_id


class SlurmCommands:
    """Locates and runs the Slurm commands of one cluster (one slurm.conf)."""

    def __init__(self, *, bin_dir: str = "", conf: str = "", timeout_s: float = 30.0) -> None:
        self.bin_dir = bin_dir
        self.conf = conf
        self.timeout_s = timeout_s

    def path(self, name: str) -> str:
        """The absolute path of command `name` (bin_dir first, then PATH, then /usr/bin)."""
        if self.bin_dir:
            candidate = Path(self.bin_dir) / name
            if not candidate.is_file():
                raise CommandError([name], f"not found in slurm.bin_dir = {self.bin_dir!r}")
            return str(candidate)
        found = shutil.which(name) or shutil.which(name, path="/usr/bin:/usr/sbin")
        if found is None:
            raise CommandError([name], "not found on PATH (install slurm-client or set slurm.bin_dir)")
        return found

    def env(self) -> Mapping[str, str]:
        env = dict(os.environ)
        if self.conf:
            env["SLURM_CONF"] = self.conf
        return env

    def run(
        self,
        name: str,
        args: Sequence[str],
        *,
        job: str | None = None,
        timeout_s: float | None = None,
        stdin: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> str:
        """Run `name args...`, return its standard output, or raise CommandError; `env`: variables
        added to the commands' environment for this call (the listing's SLURM_TIME_FORMAT)."""
        return proc.run(
            [self.path(name), *args],
            shown=[name, *args],
            timeout_s=timeout_s or self.timeout_s,
            job=job,
            env={**self.env(), **env} if env else self.env(),
            stdin=stdin,
            hint="is slurmctld up?",
        )
