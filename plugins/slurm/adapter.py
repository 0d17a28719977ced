"""The live Slurm adapter: observe with squeue/sinfo (JSON) or scontrol (text), act with scontrol.

Why these knobs (all verified on Slurm 22.05, see ../shared/notes/slurm.md):
- priority: `scontrol update JobId=J SiteFactor=N`. The site factor is added to the
  multifactor sum at once and survives recalculation; `Priority=N` would freeze multifactor
  for the job, so vjob never uses it.
- checkpointed victims: `scontrol requeuehold J` (back to the queue, held, so Slurm does not
  restart them elsewhere before vjob decides), then `release` and `update StartTime=now` to
  skip the post-requeue delay when vjob resumes them.
JSON is read where the Slurm version has a layout parse_json knows (20.11 to 22.05); every
other version is observed through `scontrol show job|node -o`, which all versions print alike.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from plugins.slurm import parse_json, parse_text
from plugins.slurm.commands import SlurmCommands, check_job_id
from vjob.config import Config
from vjob.errors import CommandError, InputError
from vjob.model import Job, Node

SITE_FACTOR_LIMIT = 2_147_483_645
"""Largest |site factor| scontrol accepts (notes: range ±2147483645)."""
JSON_VERSIONS = ((20, 11), (23, 2))
"""Slurm versions [from, to) whose --json output uses the openapi v0.0.3x layouts."""


class SlurmAdapter:
    """vjob.rms.RMSAdapter over Slurm's client commands."""

    name = "slurm"

    def __init__(
        self, commands: SlurmCommands | None = None, *, use_json: bool | None = None, site_factor_max: int = 1_000_000
    ) -> None:
        self.cmd = commands or SlurmCommands()
        self._use_json = use_json
        self.site_factor_max = min(site_factor_max, SITE_FACTOR_LIMIT)
        self._version: tuple[int, int] | None = None

    # -- observe ---------------------------------------------------------------------------------
    def version(self) -> tuple[int, int]:
        """(major, minor) of the Slurm commands, e.g. (22, 5)."""
        if self._version is None:
            out = self.cmd.run("sinfo", ["--version"])
            match = re.search(r"(\d+)\.(\d+)", out)
            if not match:
                raise CommandError(["sinfo", "--version"], f"cannot read a version in {out.strip()!r}")
            self._version = (int(match.group(1)), int(match.group(2)))
        return self._version

    @property
    def uses_json(self) -> bool:
        if self._use_json is None:
            low, high = JSON_VERSIONS
            self._use_json = low <= self.version() < high
        return self._use_json

    def all_jobs(self) -> list[Job]:
        """Every job slurmctld still remembers, finished ones included (within MinJobAge)."""
        if self.uses_json:
            out = self.cmd.run("squeue", ["--json"])
            return parse_json.jobs(_load(out, "squeue --json"), source="squeue --json")
        out = self.cmd.run("scontrol", ["show", "job", "-o"])
        if out.strip().startswith("No jobs"):
            return []
        return parse_text.jobs_from_scontrol(out, source="scontrol show job -o")

    def jobs(self) -> list[Job]:
        """Pending, held, running and suspended jobs."""
        return [j for j in self.all_jobs() if not j.state.finished]

    def job(self, job_id: str) -> Job:
        """One job, read with scontrol (which, unlike squeue --json in 22.05, honours the id)."""
        check_job_id(job_id)
        out = self.cmd.run("scontrol", ["show", "job", "-o", job_id], job=job_id)
        found = parse_text.jobs_from_scontrol(out, source=f"scontrol show job {job_id}")
        if not found:
            raise CommandError(["scontrol", "show", "job", job_id], "no such job", job=job_id)
        return found[0]

    def job_fields(self, job_id: str) -> dict[str, str]:
        """Slurm's own fields of one job (Priority, AdminComment, Reason, ...), as text."""
        check_job_id(job_id)
        out = self.cmd.run("scontrol", ["show", "job", "-o", job_id], job=job_id)
        for _line, fields in parse_text.records(out, "JobId"):
            return fields
        raise CommandError(["scontrol", "show", "job", job_id], "no such job", job=job_id)

    def nodes(self) -> list[Node]:
        if self.uses_json:
            out = self.cmd.run("sinfo", ["--json"])
            return parse_json.nodes(_load(out, "sinfo --json"), source="sinfo --json")
        out = self.cmd.run("scontrol", ["show", "node", "-o"])
        return parse_text.nodes_from_scontrol(out, source="scontrol show node -o")

    def priority_factors(self) -> dict[str, dict[str, int]]:
        """sprio's view of pending jobs: {job id: {priority, site, partition, nice, ...}}."""
        out = self.cmd.run("sprio", ["-h", "-o", "%i|%Y|%S|%P|%J|%N|%Q|%A|%F"])
        names = ("priority", "site", "partition", "jobsize", "nice", "qos", "age", "fairshare")
        factors: dict[str, dict[str, int]] = {}
        for number, line in enumerate(out.splitlines(), 1):
            parts = [p.strip() for p in line.split("|")]
            if len(parts) != len(names) + 1:
                raise CommandError(["sprio"], f"line {number}: expected {len(names) + 1} fields, got {line!r}")
            try:
                factors[parts[0]] = {n: int(float(v)) for n, v in zip(names, parts[1:], strict=True)}
            except ValueError:
                raise CommandError(["sprio"], f"line {number}: not numbers: {line!r}") from None
        return factors

    # -- act -------------------------------------------------------------------------------------
    def set_priority(self, job_id: str, value: int) -> None:
        """Set the job's site factor (vjob's share of its multifactor priority)."""
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"site factor for job {job_id}: {value!r} is not a whole number")
        if abs(value) > self.site_factor_max:
            raise InputError(
                f"site factor for job {job_id}: {value} is outside ±{self.site_factor_max} (slurm.site_factor_max)"
            )
        self._update(job_id, f"SiteFactor={value}")

    def hold(self, job_id: str) -> None:
        self._scontrol("hold", job_id)

    def release(self, job_id: str) -> None:
        self._scontrol("release", job_id)

    def requeue(self, job_id: str) -> None:
        self._scontrol("requeue", job_id)

    def requeue_hold(self, job_id: str) -> None:
        self._scontrol("requeuehold", job_id)

    def suspend(self, job_id: str) -> None:
        self._scontrol("suspend", job_id)

    def resume(self, job_id: str) -> None:
        self._scontrol("resume", job_id)

    def require_nodes(self, job_id: str, nodes: Sequence[str]) -> None:
        """Pin a held job to `nodes` before its release: its VMs' saved state is there, so the
        resume is local (no copy). The agent calls this only for nodes it saw free."""
        bad = [n for n in nodes if not _NODE_NAME.fullmatch(n)]
        if not nodes or bad:
            raise InputError(f"ReqNodeList for job {job_id}: {bad or list(nodes)!r} are not Slurm node names")
        self._update(job_id, f"ReqNodeList={','.join(nodes)}")

    def start_now(self, job_id: str) -> None:
        """Let a requeued job start at once instead of after cred_expire+1 seconds.

        Only once at least a couple of seconds have passed since the requeue: Slurm revokes
        the old run's credential with a one-second timestamp, and a restart in that same
        second on the same node is killed as "Job credential revoked" (the job then ends)."""
        self._update(job_id, "StartTime=now")

    def cancel(self, job_id: str) -> None:
        check_job_id(job_id)
        self.cmd.run("scancel", [job_id], job=job_id)

    def submit(self, args: Sequence[str], script: str) -> str:
        """Submit a batch script with sbatch `args`; returns the job id (the user-facing path)."""
        out = self.cmd.run("sbatch", ["--parsable", *args], stdin=script)
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise CommandError(["sbatch", *args], f"unexpected answer {out.strip()!r}")
        return job_id

    def _scontrol(self, verb: str, job_id: str) -> None:
        check_job_id(job_id)
        self.cmd.run("scontrol", [verb, job_id], job=job_id)

    def _update(self, job_id: str, setting: str) -> None:
        check_job_id(job_id)
        self.cmd.run("scontrol", ["update", f"JobId={job_id}", setting], job=job_id)


_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _load(out: str, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(out)
    except ValueError as exc:
        raise CommandError([what.split()[0]], f"{what} printed invalid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise CommandError([what.split()[0]], f"{what} printed JSON that is not an object")
    return doc


def make_adapter(config: Config) -> SlurmAdapter:
    """The adapter for `vjob agent --rms slurm`, from the [slurm] and [agent] sections."""
    commands = SlurmCommands(
        bin_dir=config.slurm.bin_dir, conf=config.slurm.conf, timeout_s=config.agent.command_timeout_s
    )
    return SlurmAdapter(commands, site_factor_max=config.slurm.site_factor_max)
