"""The live Slurm adapter: observe with squeue/sinfo (JSON) or scontrol (text), act with scontrol.

Why these knobs (all verified on Slurm 22.05, see ../shared/notes/slurm.md):
- priority: `scontrol update JobId=J SiteFactor=N`. The site factor is added to the
  multifactor sum at once and survives recalculation; `Priority=N` would freeze multifactor
  for the job, so vjob never uses it.
- checkpointed victims: `scontrol requeuehold J` (back to the queue, held, so Slurm does not
  restart them elsewhere before vjob decides), then `release` and `update StartTime=now` to
  skip the post-requeue delay when vjob resumes them.
Observation is JSON on every Slurm that has it (20.11 and later): there a job name or a
comment is one JSON string and cannot pose as another field. From 23.02 the adapter asks for
an explicit data_parser version (`squeue --json=v0.0.40`, as Slurm's docs advise, so an
upgrade of Slurm does not silently change the layout under vjob). Only Slurm before 20.11 is
observed through `scontrol show job -o`, whose records are checked (parse_text) and
cross-checked against the job ids squeue prints, one digits-only id per line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from plugins.slurm import hostlist, json_stream, parse_json, parse_text, sprio_lines
from plugins.slurm.commands import SlurmCommands, check_job_id
from plugins.slurm.environment import ENVIRONMENT, wake_file
from plugins.slurm.incremental import LISTING_ARGS, LISTING_ENV, IncrementalJobs
from plugins.slurm.json_fields import NodeReuse, Reuse
from plugins.slurm.json_pace import Pace
from plugins.slurm.json_tail import Fetch as TailFetch
from plugins.slurm.node_listing import LISTING_ARGS as NODE_LISTING_ARGS
from plugins.slurm.node_listing import IncrementalNodes
from plugins.slurm.proctrack import ProctrackReader
from plugins.slurm.site_default import sync_partition_defaults
from plugins.slurm.site_priority import SiteReader
from plugins.slurm.vm_sizes import Publisher, sizes_file
from preemption.scheduling.site_order import SiteOrder
from provisioning.images import StoreNodeOS, with_node_os
from vjob import log, record_text
from vjob.config import Config
from vjob.errors import CommandError, InputError
from vjob.model import Job, Node
from vjob.rms import Abilities, PriorityKnob

SITE_FACTOR_LIMIT = 2_147_483_645
"""Largest |site factor| scontrol accepts (notes: range ±2147483645)."""
JSON_SINCE = (20, 11)
"""First Slurm version whose squeue/sinfo print --json."""
DATA_PARSER_SINCE = (23, 2)
"""First Slurm version that takes an explicit data_parser (`--json=v0.0.39`) and has `scontrol --json`."""
DATA_PARSER_FOR = (((24, 11), "v0.0.42"), ((24, 5), "v0.0.41"), ((23, 11), "v0.0.40"), ((23, 2), "v0.0.39"))
"""The newest data_parser vjob reads that each Slurm release prints (each release keeps the two
before its own, so 25.05 and 25.11 still print v0.0.42)."""
FETCH_IDS = 2000
"""Job ids per `squeue --jobs=` call (a few dozen KB of arguments)."""
SCONTROL_IDS = 500
"""Job ids per `update JobId=a,b,... SiteFactor=N` line."""
_JOB_ID_LINE = re.compile(r"[0-9]{1,10}")


class SlurmAdapter:
    """vjob.rms.RMSAdapter over Slurm's client commands."""

    name = "slurm"

    def __init__(
        self,
        commands: SlurmCommands | None = None,
        *,
        use_json: bool | None = None,
        site_factor_max: int = 1_000_000,
        node_os: Callable[[], dict[str, str]] | None = None,
        on_nodes: Callable[[list[Node]], None] | None = None,
        order_share: float = 1.0,
        resync_every: int = 0,
        json_read_share: float = 1.0,
        json_read_share_woken: float = 1.0,
    ) -> None:
        self.cmd = commands or SlurmCommands()
        self.incremental = (
            IncrementalJobs(
                self._list_jobs,
                self._fetch_jobs,
                self._read_all_jobs,
                resync_every=resync_every,
                pace=Pace(json_read_share, woken_share=json_read_share_woken),
            )
            if resync_every > 1
            else None
        )
        """Observation by change (plugins.slurm.incremental), `[slurm] resync_every` > 1; else
        every job's JSON at every tick. Its JSON reads paced to `[slurm] json_read_share`."""
        self.reuse = Reuse()
        self.node_reuse = NodeReuse()
        """The Jobs of the last streamed reads, given back as they were where unchanged
        (plugins.slurm.json_fields)."""
        self.tail_fetch = TailFetch()
        """A few jobs' JSON where squeue ignores the filter (_fetch_jobs; plugins.slurm.json_tail)."""
        self.node_listing = (
            IncrementalNodes(
                self._list_nodes, self._read_all_nodes, resync_every=resync_every, resync_due=self._jobs_whole
            )
            if resync_every > 1
            else None
        )
        """The nodes from a text listing, their JSON on the ticks the jobs' is read whole
        (plugins.slurm.node_listing); with `resync_every` <= 1 the JSON at every tick."""
        self.node_os = node_os
        self.on_nodes = on_nodes
        """Told the nodes at every read (plugins.slurm.vm_sizes.Publisher: job_submit.lua's sizes)."""
        """Node → the OS image its vjob VMs run (provisioning.images.node_os): Slurm knows none."""
        self._use_json = use_json
        self._forced_json = use_json is True
        self.site_factor_max = min(site_factor_max, SITE_FACTOR_LIMIT)
        self._version: tuple[int, int] | None = None
        knob = PriorityKnob(0, self.site_factor_max, min_step=max(1, self.site_factor_max // 1000), share=order_share)
        self.site = SiteReader(self.cmd, self.site_factor_max, order_share) if order_share < 1.0 else None
        """Reads the site's own priorities when vjob shares the order (`[slurm] order_share` < 1)."""
        self.sprio = sprio_lines.SprioLines()
        """sprio's lines kept from tick to tick (plugins.slurm.sprio_lines)."""
        self.abilities = Abilities(
            priority=knob,
            requeue_hold=True,
            hold_release=True,
            suspend=True,
            pin_nodes=True,
            start_now=True,
            environment=ENVIRONMENT,
            wake_files=(wake_file(self.cmd.conf),),
            wait_field="AdminComment",
            cpu_handover=True,  # cons_tres releases a suspended job's cores, not its memory
        )
        self.proctrack = ProctrackReader(lambda: self.cmd.run("scontrol", ["show", "config"]))
        """Whether a suspend spares pause-first's drainer (plugins.slurm.proctrack)."""

    # -- observe ---------------------------------------------------------------------------------
    def version(self) -> tuple[int, int]:
        """(major, minor) of the Slurm commands, e.g. (22, 5)."""
        if self._version is None:
            out = self.cmd.run("sinfo", ["--version"])
            match = re.search(r"([0-9]{1,3})\.([0-9]{1,3})", out)
            if not match:
                raise CommandError(["sinfo", "--version"], f"cannot read a version in {out.strip()!r}")
            self._version = (int(match.group(1)), int(match.group(2)))
        return self._version

    @property
    def uses_json(self) -> bool:
        if self._use_json is None:
            self._use_json = self.version() >= JSON_SINCE
        return self._use_json

    def data_parser(self) -> str | None:
        """The data_parser version to ask for ('v0.0.40'), None before 23.02 (plain --json).

        An adapter built with use_json=True and no version asked yet does not ask for one:
        it was told the layout, and plain --json is what it reads."""
        if self._forced_json and self._version is None:
            return None
        version = self.version()
        return next((parser for since, parser in DATA_PARSER_FOR if version >= since), None)

    def _json_flag(self) -> str:
        parser = self.data_parser()
        return f"--json={parser}" if parser else "--json"

    def all_jobs(self) -> list[Job]:
        """Every job slurmctld still remembers, finished ones included (within MinJobAge)."""
        if self.uses_json:
            flag = self._json_flag()
            out = self.cmd.run("squeue", [flag])
            return parse_json.jobs(_load(out, f"squeue {flag}"), source=f"squeue {flag}")
        return self._jobs_from_text()

    def _jobs_from_text(self) -> list[Job]:
        """Slurm before 20.11: `scontrol show job -o`, checked record by record (see parse_text),
        and only for ids squeue lists (a line break in a user's path could forge a whole record).
        A record that cannot be trusted is logged and left out; the others are still seen."""
        ids_out = self.cmd.run("squeue", ["-h", "-t", "all", "-o", "%A"])
        ids = set()
        for number, line in enumerate(ids_out.splitlines(), 1):
            if line.strip() and not _JOB_ID_LINE.fullmatch(line.strip()):
                raise CommandError(["squeue"], f"line {number}: {line.strip()[:40]!r} is not a job id")
            ids.add(line.strip())
        out = self.cmd.run("scontrol", ["show", "job", "-o"])
        if out.strip().startswith("No jobs"):
            return []
        skipped: list[str] = []
        found = parse_text.jobs_from_scontrol(out, source="scontrol show job -o", skipped=skipped)
        counts: dict[str, int] = {}
        for job in found:
            counts[job.id] = counts.get(job.id, 0) + 1
        kept = []
        for job in found:
            if job.id not in ids or counts[job.id] > 1:
                skipped.append(f"job {job.id}: not (or not once) among squeue's job ids: a forged record")
            else:
                kept.append(job)
        if skipped:
            log.get("slurm").warning("unreadable job records left out", records=skipped[:20], count=len(skipped))
        return kept

    def jobs(self) -> list[Job]:
        """Pending, held, running and suspended jobs (by change when `resync_every` > 1)."""
        if self.incremental is not None and self.uses_json:
            return self.incremental.jobs()
        return [j for j in self.all_jobs() if not j.state.finished]

    def woken(self) -> None:
        """The agent was woken (job_submit.lua accepted an interactive job): the next look reads
        the new jobs' JSON at `[slurm] json_read_share_woken`'s pace (plugins.slurm.json_pace)."""
        if self.incremental is not None:
            self.incremental.wake()

    def _list_jobs(self) -> str:
        """The listing (plugins.slurm.incremental), its times in POSIX seconds (LISTING_ENV)."""
        return self.cmd.run("squeue", list(LISTING_ARGS), env=dict(LISTING_ENV))

    def _read_all_jobs(self) -> list[Job]:
        """Every job's JSON, read as a stream (plugins.slurm.json_stream): a site's listing
        is too large to hold as text and as dicts at once."""
        flag = self._json_flag()
        chunks = json_stream.command_chunks(self.cmd, "squeue", [flag])
        return json_stream.jobs(chunks, source=f"squeue {flag}", reuse=self.reuse)

    def _fetch_jobs(self, ids: set[str]) -> list[Job]:
        """The JSON of the jobs `ids`: `squeue --json=V --jobs=...` where squeue honours the
        filter (23.02 and later: the data_parser releases), a few thousand ids a call; before,
        squeue --json prints every job whatever it is asked (notes, 22.05), so squeue writes
        the whole listing into a memfd and only these jobs are searched, from its end, and
        decoded into Jobs (plugins.slurm.json_tail: new jobs are printed last)."""
        flag = self._json_flag()
        wanted = {int(j) for j in ids if j.isdigit()}
        if not self.data_parser():
            return self.tail_fetch.jobs(self.cmd, [flag], wanted, source=f"squeue {flag}", reuse=self.reuse)
        found: list[Job] = []
        ordered = sorted(wanted)
        for at in range(0, len(ordered), FETCH_IDS):
            part = ordered[at : at + FETCH_IDS]
            args = [flag, "-t", "all", f"--jobs={','.join(map(str, part))}"]
            try:
                chunks = json_stream.command_chunks(self.cmd, "squeue", args)
                found += json_stream.jobs(chunks, source=f"squeue {flag} --jobs", keep=wanted, reuse=self.reuse)
            except CommandError as exc:
                if len(part) > 1 or "Invalid job id" not in str(exc):
                    raise
                # squeue -j of one job that just ended says "Invalid job id": it is gone
        return found

    def job(self, job_id: str) -> Job:
        """One job: `scontrol --json show job J` from 23.02, squeue --json (which in 20.11-22.05
        ignores the id) filtered here, or `scontrol show job -o J` before 20.11."""
        check_job_id(job_id)
        if self.uses_json:
            if self.data_parser():
                flag = self._json_flag()
                out = self.cmd.run("scontrol", [flag, "show", "job", job_id], job=job_id)
                found = parse_json.jobs(_load(out, f"scontrol {flag}"), source=f"scontrol {flag} show job {job_id}")
            else:
                found = self.all_jobs()
        else:
            out = self.cmd.run("scontrol", ["show", "job", "-o", job_id], job=job_id)
            found = parse_text.jobs_from_scontrol(out, source=f"scontrol show job {job_id}")
        match = [j for j in found if j.id == job_id]
        if not match:
            raise CommandError(["scontrol", "show", "job", job_id], "no such job", job=job_id)
        return match[0]

    def job_fields(self, job_id: str) -> dict[str, str]:
        """Slurm's own fields of one job (Priority, AdminComment, Reason, ...), as text; an
        InputError when the record cannot be told apart from text its user wrote into it."""
        check_job_id(job_id)
        out = self.cmd.run("scontrol", ["show", "job", "-o", job_id], job=job_id)
        found = list(parse_text.records(out, "JobId"))
        if len(found) != 1 or found[0][1].get("JobId") != job_id.split("_")[0].split("+")[0]:
            if not found:
                raise CommandError(["scontrol", "show", "job", job_id], "no such job", job=job_id)
            what = f"expected one record of job {job_id}, got {len(found)}"
            raise CommandError(["scontrol", "show", "job", job_id], what, job=job_id)
        return found[0][1]

    def tell_wait(self, job_id: str, reason: str | None) -> bool:
        """Why a held-back interactive job waits, in its AdminComment: only root and SlurmUser
        may write it (the user's `scontrol update` is refused), `scontrol show job`, `squeue -O
        admin_comment` (22.05 refuses `AdminComment` there) and `squeue --json` show it to the
        user, and the user's own `--comment` stays theirs. Read, edited by vjob.record_text (every other
        character kept) and written back only when it changed; False when nothing was written."""
        current = self.job_fields(job_id).get("AdminComment", "")
        current = "" if current == "(null)" else current
        new = record_text.with_notice(current, reason)
        if new == current:
            return False
        self.cmd.run("scontrol", ["update", f"JobId={job_id}", f"AdminComment={new}"], job=job_id)
        return True

    def nodes(self) -> list[Node]:
        """Every node as Slurm reports it, with the OS image the store says it runs (UBIS's VM_os)."""
        nodes = self._nodes()
        if self.on_nodes is not None:
            self.on_nodes(nodes)
        return with_node_os(nodes, self.node_os()) if self.node_os is not None else nodes

    def _nodes(self) -> list[Node]:
        if self.node_listing is not None and self.uses_json:
            return self.node_listing.nodes()
        return self._read_all_nodes()

    def _list_nodes(self) -> str:
        return self.cmd.run("sinfo", list(NODE_LISTING_ARGS))

    def _jobs_whole(self) -> bool:
        """Whether this tick's jobs were read whole (observe reads the jobs, then the nodes)."""
        return self.incremental is not None and self.incremental.last.full

    def _read_all_nodes(self) -> list[Node]:
        if self.uses_json:  # streamed, by Slurm's layout (json_stream.nodes): 10,000 nodes are 13 MB
            flag = self._json_flag()
            if self.data_parser():  # data_parser sinfo groups nodes; scontrol lists each one
                chunks = json_stream.command_chunks(self.cmd, "scontrol", [flag, "show", "node"])
                return json_stream.nodes(chunks, source=f"scontrol {flag} show node", reuse=self.node_reuse)
            chunks = json_stream.command_chunks(self.cmd, "sinfo", [flag])
            return json_stream.nodes(chunks, source=f"sinfo {flag}", reuse=self.node_reuse)
        out = self.cmd.run("scontrol", ["show", "node", "-o"])
        return parse_text.nodes_from_scontrol(out, source="scontrol show node -o")

    def priority_factors(self) -> dict[str, dict[str, int]]:
        """sprio's view of pending jobs: {job id: {priority, site, partition, nice, ...}}, every
        line read (plugins.slurm.sprio_lines.factors: `vjob drain`, not the tick)."""
        return sprio_lines.factors(self.cmd.run("sprio", list(sprio_lines.SPRIO_ARGS)))

    def site_priorities(self) -> SiteOrder | None:
        """The pending jobs' own multifactor priority (sprio's PRIORITY − SITE) and the site's
        span (its PriorityWeight* summed), when vjob shares the order with the site; None when
        it owns it (`order_share` = 1). A span whose bands do not fit site_factor_max raises.
        sprio is read by change (plugins.slurm.sprio_lines): only the lines not printed the
        tick before are read."""
        if self.site is None:
            return None
        own = self.sprio.read(self.cmd.run("sprio", list(sprio_lines.SPRIO_ARGS)))
        return self.site.order(own)

    def knob_values(self) -> dict[str, int]:
        """Each pending job's site factor as sprio shows it: what `vjob drain` sets back to 0."""
        return {job: factors["site"] for job, factors in self.priority_factors().items()}

    def neutral_priority(self) -> int:
        """The site factor of a job vjob never wrote to (no site_factor plugin: 0)."""
        return 0

    # -- act -------------------------------------------------------------------------------------
    def set_priority(self, job_id: str, value: int) -> None:
        """Set the job's site factor (vjob's share of its multifactor priority)."""
        self._check_factor(job_id, value)
        self._update(job_id, f"SiteFactor={value}")

    def set_priorities(self, values: Mapping[str, int]) -> dict[str, str]:
        """Set many site factors in one `scontrol` run; job id → error of those not set.

        scontrol reads commands from its standard input when given none (its interactive
        mode), and `update JobId=a,b,c` takes a list of jobs (man scontrol, 22.05): the jobs
        sharing a value go on one line, every line to one process. That process exits non-zero
        when any line failed without saying which, so then each line is sent alone, and a
        failed line's jobs one by one, to name the jobs whose value did not reach Slurm."""
        by_value: dict[int, list[str]] = {}
        for job_id, value in values.items():
            check_job_id(job_id)
            self._check_factor(job_id, value)
            by_value.setdefault(value, []).append(job_id)
        lines = [
            (ids[at : at + SCONTROL_IDS], value)
            for value, ids in by_value.items()
            for at in range(0, len(ids), SCONTROL_IDS)
        ]
        if not lines:
            return {}
        script = "".join(f"update JobId={','.join(ids)} SiteFactor={value}\n" for ids, value in lines)
        try:
            self.cmd.run("scontrol", [], stdin=script + "quit\n")
            return {}
        except CommandError:
            pass  # which line failed is not said: each one again on its own
        failed: dict[str, str] = {}
        for ids, value in lines:
            try:
                self._update(",".join(ids), f"SiteFactor={value}")
                continue
            except CommandError as exc:
                if len(ids) == 1:
                    failed[ids[0]] = str(exc)
                    continue
            for job_id in ids:
                try:
                    self._update(job_id, f"SiteFactor={value}")
                except CommandError as exc:
                    failed[job_id] = str(exc)
        return failed

    def _check_factor(self, job_id: str, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"site factor for job {job_id}: {value!r} is not a whole number")
        if abs(value) > self.site_factor_max:
            raise InputError(
                f"site factor for job {job_id}: {value} is outside ±{self.site_factor_max} (slurm.site_factor_max)"
            )

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

    def suspend_spares_detached(self) -> tuple[bool, str]:
        """From ProctrackType and SelectTypeParameters (plugins.slurm.proctrack)."""
        return self.proctrack.spares_detached()

    def require_nodes(self, job_id: str, nodes: Sequence[str]) -> None:
        """Pin a held job to `nodes` before its release: its VMs' saved state is there, so the
        resume is local (no copy). The agent calls this only for nodes it saw free."""
        bad = [n for n in nodes if not isinstance(n, str) or not hostlist.NODE_NAME.fullmatch(n)]
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
        if not _JOB_ID_LINE.fullmatch(job_id):
            raise CommandError(["sbatch", *args], f"unexpected answer {out.strip()!r}")
        return job_id

    def _scontrol(self, verb: str, job_id: str) -> None:
        check_job_id(job_id)
        self.cmd.run("scontrol", [verb, job_id], job=job_id)

    def _update(self, job_id: str, setting: str) -> None:
        for one in job_id.split(","):
            check_job_id(one)
        self.cmd.run("scontrol", ["update", f"JobId={job_id}", setting], job=job_id)


def _load(out: str, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(out)
    except (ValueError, RecursionError) as exc:
        raise CommandError([what.split()[0]], f"{what} printed invalid JSON: {str(exc)[:200]}") from None
    if not isinstance(doc, dict):
        raise CommandError([what.split()[0]], f"{what} printed JSON that is not an object")
    return doc


def make_adapter(config: Config) -> SlurmAdapter:
    """The adapter for `vjob agent --rms slurm`, from the [slurm] and [agent] sections; brings
    job_submit.lua's partition defaults in line with [slurm] (plugins.slurm.site_default)."""
    sync_partition_defaults(config.slurm)
    commands = SlurmCommands(
        bin_dir=config.slurm.bin_dir, conf=config.slurm.conf, timeout_s=config.agent.command_timeout_s
    )
    sizes = Publisher(sizes_file(config.slurm.conf), config.provisioning.vm_overhead_mib)
    return SlurmAdapter(
        commands,
        site_factor_max=config.slurm.site_factor_max,
        node_os=StoreNodeOS(config),
        on_nodes=sizes,
        order_share=config.slurm.order_share,
        resync_every=config.slurm.resync_every,
        json_read_share=config.slurm.json_read_share,
        json_read_share_woken=config.slurm.json_read_share_woken,
    )
