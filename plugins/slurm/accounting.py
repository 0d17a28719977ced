"""The VMs' usage written into a Slurm job's record: its AdminComment, which `sacct` shows.

Why AdminComment: only root and SlurmUser may change it (a user cannot forge or erase what root
wrote there), slurmdbd keeps it with the job, and every site can read it with
`sacct -j N -o JobID,ExitCode,TotalCPU,AdminComment -P`. A TRES of our own would need a
slurmdbd change and a restart per site; AdminComment needs nothing. The field already holds
job_submit.lua's label and maybe an operator's note: only this node's `vjob-usage@<node>:...`
word is replaced (vjob.usage_record).

Two ways in, because the run that ends may be the job's last:
- while the controller holds the job as running (or pending after a requeue):
  `scontrol update JobId=N AdminComment=...`, read back from `scontrol show job`;
- once it has finished (scontrol answers "Job has already finished" or no longer knows it):
  `sacctmgr -i modify job where jobid=N set AdminComment=...`, read back from `sacct`.

No compare-and-swap exists for the field, and each node of a multi-node job writes its own word
at about the same time. So every write is read back after a short, jittered settle: a word a
concurrent writer's older copy overwrote is written again onto the newer text. A lost update
would need a node's read-to-write gap (a few tens of ms) to outlast the other node's settle.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from plugins.slurm.adapter import SlurmAdapter
from plugins.slurm.commands import check_job_id
from vjob import usage_record
from vjob.errors import CommandError
from vjob.usage_record import Usage

SETTLE_S = 1.0
"""Wait before reading a write back (jittered up to twice that)."""
ATTEMPTS = 4
_FINISHED = ("already finished", "Invalid job id")
_LIVE = frozenset(
    (
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "CONFIGURING",
        "RESIZING",
        "STOPPED",
        "COMPLETING",
    )
)
"""States in which the controller takes `scontrol update` of the job (and holds its newest text).
COMPLETING is a requeue winding up too (Slurm shows the flag, not the pending state under it):
the run's usage must stay with the job's live text, which its next run adds to; for a job
really ending, an update refused as finished goes to slurmdbd (`_write`)."""


class SlurmUsageWriter:
    """Adds one run's usage on one node to a Slurm job's AdminComment (root or SlurmUser only)."""

    rms = "slurm"

    def __init__(
        self,
        adapter: SlurmAdapter,
        *,
        settle_s: float = SETTLE_S,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.adapter = adapter
        self.settle_s = settle_s
        self.sleep = sleep
        self.rng = rng or random.Random()

    def add(self, job: str, node: str, run: Usage) -> str:
        """Write `node`'s figures plus `run`'s into the job's record; the record's text after."""
        check_job_id(job)
        for _attempt in range(ATTEMPTS):
            current, in_db = self.read(job)
            text = usage_record.merged(current, node, run)
            self._write(job, text, in_db)
            self.sleep(self.settle_s * (1.0 + self.rng.random()))
            after, _ = self.read(job)
            if usage_record.parse(after).get(node) == usage_record.parse(text).get(node):
                return after
        raise CommandError(
            ["scontrol", "update", f"JobId={job}", "AdminComment=..."],
            f"node {node}'s usage word was overwritten {ATTEMPTS} times by concurrent writers",
            job=job,
        )

    def read(self, job: str) -> tuple[str, bool]:
        """The job's AdminComment and whether it came from slurmdbd: the controller's while it
        holds the job unfinished (slurmdbd's copy lags it), slurmdbd's once the job finished."""
        try:
            fields = self.adapter.job_fields(job)
        except CommandError as exc:
            if not any(word in str(exc) for word in (*_FINISHED, "no such job")):
                raise
            fields = {}
        state = fields.get("JobState", "").split(" ")[0]
        if state in _LIVE:
            return fields.get("AdminComment", ""), False
        out = self.adapter.cmd.run("sacct", ["-n", "-P", "-X", "-j", job, "-o", "AdminComment"], job=job)
        lines = out.splitlines()
        return (lines[-1] if lines else ""), True  # a reused job id: the newest record is last

    def _write(self, job: str, text: str, in_db: bool) -> None:
        """Write `text` through the controller, or slurmdbd once the job finished (also when
        it finished between the read and this write)."""
        if not in_db:
            try:
                self.adapter.cmd.run("scontrol", ["update", f"JobId={job}", f"AdminComment={text}"], job=job)
                return
            except CommandError as exc:
                if not any(word in str(exc) for word in _FINISHED):
                    raise
        self.adapter.cmd.run(
            "sacctmgr", ["-i", "modify", "job", "where", f"jobid={job}", "set", f"AdminComment={text}"], job=job
        )


def usage_of(text: str) -> dict[str, Usage]:
    """Each node's figures in an AdminComment (for operators' tools and tests)."""
    return usage_record.parse(text)
