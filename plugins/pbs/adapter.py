"""The agent's hands on a Torque or OpenPBS server: observe with qstat/pbsnodes, act with
qalter/qhold/qrls/qrerun/qsig/qsub.

Why through the client commands: they are the one interface both dialects keep stable, they
authenticate as the agent's user exactly as an operator would, and their output is what the
tests replay (PBS cannot run on the development machine; see docs/pbs.md). Every command is
an argument list with a timeout; a job id is checked against the PBS id syntax before it
reaches an argument list, so no job data can become an option or a shell word.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from plugins.pbs import names, records
from plugins.pbs.config import PbsConfig
from plugins.pbs.convert import Conventions
from plugins.pbs.held_priority import held_priorities
from plugins.pbs.parse import parse_jobs, parse_nodes
from provisioning.images import StoreNodeOS, with_node_os
from vjob import log, proc, record_text
from vjob.config import Config
from vjob.errors import CommandError, InputError
from vjob.model import Job, Node
from vjob.rms import Abilities, JobEnvironment, PriorityKnob

ENVIRONMENT = JobEnvironment(job_id="PBS_JOBID", node_name="PBS_NODENAME", node_list="PBS_NODEFILE")

T = TypeVar("T")

PRIORITY_MIN, PRIORITY_MAX = -1024, 1023
"""The range `qalter -p` accepts on Torque and OpenPBS."""
ORDER_MIN, ORDER_MAX = 0, 1_000_000
"""The range vjob writes into its custom resource (`[pbs] order = "resource"`, a long): wide
enough for a distinct value per queued job, 1,000 steps between neighbours of a 1,000-job queue."""
NEUTRAL = 0
"""What a job holds when vjob has not written to it: Priority's default, and the value the
documented `resources_default` gives the custom resource (what `vjob drain` puts back)."""

JOB_ID = names.JOB_ID
"""`123`, `123.server.domain`, `673175[]`, `673175[19].server` — and nothing that starts with '-'."""


def check_job_id(job_id: str) -> str:
    """The job id, or InputError when it is not PBS id syntax (never passed on to a command)."""
    return names.job_id(job_id)


def _array_parent(job_id: str) -> str:
    """`123[4].server` → `123[].server`, the id PBS gives the array itself."""
    return re.sub(r"\[[0-9]+\]", "[]", job_id, count=1)


class PbsAdapter:
    """RMSAdapter for Torque (dialect "torque") and OpenPBS / PBS Pro (dialect "openpbs")."""

    name = "pbs"
    abilities = Abilities(
        priority=PriorityKnob(PRIORITY_MIN, PRIORITY_MAX),
        requeue_hold=True,  # qhold, then qrerun
        hold_release=True,
        suspend=True,  # qsig -s suspend|resume
        pin_nodes=False,
        start_now=False,
        environment=ENVIRONMENT,
        wait_field="comment",
    )
    """With `[pbs] order = "resource"` the instance's knob is the custom resource's range."""

    def __init__(
        self,
        config: PbsConfig | None = None,
        *,
        timeout_s: float = 30.0,
        node_os: Callable[[], dict[str, str]] | None = None,
    ) -> None:
        self.config = config or PbsConfig()
        self.node_os = node_os
        """Node → the OS image its vjob VMs run (provisioning.images.node_os), for nodes whose
        pbsnodes record names none (no `current_aoe`, no OS property)."""
        self.timeout_s = timeout_s
        self.conventions = Conventions(
            interactive_queues=tuple(self.config.interactive_queues),
            besteffort_queues=tuple(self.config.besteffort_queues),
            os_property_prefix=self.config.os_property_prefix,
        )
        self._log = log.get("pbs")
        self.held: dict[str, int] = {}
        """The Priority each job held at the last `jobs()` read (held_priority.py): what a
        user's `qalter -p` may have changed; the agent sends its own value again (`resync`).
        With order = "resource", the custom resource's value instead."""
        self.order_field = "Priority"
        """The job attribute vjob's order is written to and read back from."""
        if self.config.order == "resource":
            self.order_field = f"Resource_List.{self.config.order_resource}"
            knob = PriorityKnob(ORDER_MIN, ORDER_MAX, min_step=(ORDER_MAX - ORDER_MIN) // 1000)
            self.abilities = replace(type(self).abilities, priority=knob)

    # -- running a command ----------------------------------------------------------------------
    def _program(self, name: str) -> str:
        return str(Path(self.config.bin_dir) / name) if self.config.bin_dir else name

    def _run(self, args: Sequence[str], *, job: str | None = None) -> str:
        """stdout of the command, or CommandError naming it (and the job) for any failure."""
        argv = [self._program(args[0]), *args[1:]]
        stdout = proc.run(
            argv,
            timeout_s=self.timeout_s,
            job=job,
            env={**os.environ, "LC_ALL": "C"},
            missing_hint="set [pbs] bin_dir or PATH",
        )
        self._log.debug("pbs command", command=argv, jobs=[job] if job else [])
        return stdout

    def _read(self, args: Sequence[str], parse: Callable[..., list[T]]) -> list[T]:
        """Run an observing command and parse its output; garbage becomes a CommandError."""
        return self._parse(args, self._run(args), parse)

    def _parse(self, args: Sequence[str], text: str, parse: Callable[..., list[T]]) -> list[T]:
        try:
            return parse(text, source=" ".join(args), conventions=self.conventions)
        except InputError as exc:
            raise CommandError(list(args), f"printed output vjob cannot read: {exc}") from None

    # -- observe ---------------------------------------------------------------------------------
    def job_command(self) -> list[str]:
        if self.config.dialect == "openpbs":
            return ["qstat", "-f", "-F", "json", "-t"]
        if self.config.torque_format == "xml":
            return ["qstat", "-x", "-t"]
        return ["qstat", "-f", "-t"]

    def node_command(self) -> list[str]:
        if self.config.dialect == "openpbs":
            return ["pbsnodes", "-av", "-F", "json"]
        return ["pbsnodes", "-x"] if self.config.torque_format == "xml" else ["pbsnodes", "-a"]

    def jobs(self) -> list[Job]:
        """Jobs that are pending, held, running or suspended (finished ones are dropped).

        An array's parent record (`123[].server`) is dropped when its subjobs are listed
        (`-t`): the subjobs are the work, and counting the parent too would count it twice.
        """
        args = self.job_command()
        text = self._run(args)
        listed = [j for j in self._parse(args, text, parse_jobs) if not j.state.finished]
        knob = self.abilities.priority
        assert knob is not None
        try:
            self.held = held_priorities(
                text, source=" ".join(args), field=self.order_field, low=knob.low, high=knob.high
            )
        except InputError:
            self.held = {}
        parents_with_subjobs = {_array_parent(j.id) for j in listed if "[" in j.id and "[]" not in j.id}
        return [j for j in listed if j.id not in parents_with_subjobs]

    def nodes(self) -> list[Node]:
        """Every node; its OS image from PBS (current_aoe, OS property) or else from the store."""
        nodes = self._read(self.node_command(), parse_nodes)
        return with_node_os(nodes, self.node_os()) if self.node_os is not None else nodes

    # -- act -------------------------------------------------------------------------------------
    def set_priority(self, job_id: str, value: int) -> None:
        """`qalter -p VALUE JOB`, or `qalter -l vjob_order=VALUE JOB` with order = "resource"
        (the agent must then be a PBS operator or manager: users cannot set the resource)."""
        check_job_id(job_id)
        knob = self.abilities.priority
        assert knob is not None
        if isinstance(value, bool) or not isinstance(value, int) or not knob.low <= value <= knob.high:
            raise InputError(f"job {job_id}: priority = {value!r}: must be an integer in {knob.low}..{knob.high}")
        if self.config.order == "resource":
            self._run(["qalter", "-l", f"{self.config.order_resource}={value}", job_id], job=job_id)
        else:
            self._run(["qalter", "-p", str(value), job_id], job=job_id)

    def knob_values(self) -> dict[str, int]:
        """What vjob's knob holds on each listed job (as of the last `jobs()` read), for `vjob
        drain` to put back NEUTRAL where vjob wrote something else."""
        return dict(self.held)

    def neutral_priority(self) -> int:
        """The knob's value when vjob has written nothing (Priority 0; the resource's default 0)."""
        return NEUTRAL

    def hold(self, job_id: str) -> None:
        self._run(["qhold", "-h", "u", check_job_id(job_id)], job=job_id)

    def release(self, job_id: str) -> None:
        self._run(["qrls", "-h", "u", check_job_id(job_id)], job=job_id)

    def rerun(self, job_id: str) -> None:
        self._run(["qrerun", check_job_id(job_id)], job=job_id)

    def requeue_hold(self, job_id: str) -> None:
        """Hold first, then requeue: the scheduler can never restart the job in between.

        When the requeue fails (e.g. a job submitted with `-r n` is not rerunnable) the hold is
        taken back, so the job — which keeps running, its pilot resuming the VM — is not left
        with a hold that would strand it in the queue after some later requeue.
        """
        self.hold(job_id)
        try:
            self.rerun(job_id)
        except CommandError as failed:
            try:
                self.release(job_id)
                self._log.warning("qrerun failed; the hold is taken back", jobs=[job_id], error=str(failed))
            except CommandError as also:
                self._log.error("hold left on a job that could not be requeued", jobs=[job_id], error=str(also))
            raise failed from None

    def suspend(self, job_id: str) -> None:
        """`qsig -s suspend`: on OpenPBS this fires the hook's execjob_postsuspend checkpoint."""
        self._run(["qsig", "-s", "suspend", check_job_id(job_id)], job=job_id)

    def resume(self, job_id: str) -> None:
        self._run(["qsig", "-s", "resume", check_job_id(job_id)], job=job_id)

    def comment(self, job_id: str) -> str:
        """The job's `comment` attribute as `qstat -f` shows it ('' when it has none)."""
        check_job_id(job_id)
        if self.config.dialect == "openpbs":
            text = self._run(["qstat", "-f", "-F", "json", job_id], job=job_id)
            _kind, found = records.openpbs_json(text, source=f"qstat -f -F json {job_id}")
        else:
            text = self._run(["qstat", "-f", job_id], job=job_id)
            found = records.pbs_text_jobs(text, source=f"qstat -f {job_id}")
        if len(found) != 1:
            raise CommandError(["qstat", "-f", job_id], f"expected one record of job {job_id}, got {len(found)}")
        value = found[0].get("comment", "")
        return value if isinstance(value, str) else ""

    def tell_wait(self, job_id: str, reason: str | None) -> bool:
        """Why a held-back interactive job waits, in its `comment` attribute: users cannot set
        it (NO_USER_SET), operators and managers can (`qalter -W comment=...`), `qstat -f` shows
        it. The scheduler writes it too (OpenPBS: each cycle a job does not run, unless
        sched_config's undocumented `update_comments` is off): vjob's group is kept apart from
        the scheduler's text (vjob.record_text) and written only when it changed. The value is
        quoted for qalter's `-W` list (commas separate attributes there)."""
        current = self.comment(job_id)
        new = record_text.with_notice(current, reason)
        if new == current:
            return False
        if '"' in new:
            raise InputError(f"job {job_id}: comment {new[:80]!r}: a double quote cannot pass qalter -W")
        self._run(["qalter", "-W", f'comment="{new}"', job_id], job=job_id)
        return True

    def submit(self, script: str | os.PathLike[str], *, options: Sequence[str] = ()) -> str:
        """`qsub [options] SCRIPT`; the new job's id, checked to be one."""
        path = Path(script)
        if not path.is_file():
            raise InputError(f"job script {str(path)!r}: not a file")
        for option in options:
            if not isinstance(option, str) or "\n" in option or "\0" in option:
                raise InputError(f"qsub option {option!r}: must be a single-line string")
        argv = ["qsub", *options, str(path)]
        out = self._run(argv).strip()
        if not JOB_ID.fullmatch(out):
            raise CommandError(argv, f"printed {out[:80]!r} instead of a job id")
        return out


def make_adapter(config: Config | PbsConfig | None = None) -> PbsAdapter:
    """The adapter `vjob agent --rms pbs` uses, from the whole configuration or its [pbs] section."""
    if isinstance(config, Config):
        return PbsAdapter(config.pbs, timeout_s=config.agent.command_timeout_s, node_os=StoreNodeOS(config))
    return PbsAdapter(config)
