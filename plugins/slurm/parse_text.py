"""Slurm's text outputs: `scontrol show job|node|partition` (multi-line or -o) and JSON lines.

Why text at all: Slurm before 20.11 has no --json, and a recorded `scontrol show` is what
operators paste; the live adapter reads JSON wherever the version has it. JSON lines are what
sites print with a custom `squeue -o '{"id": %i, ...}'` format.

Why the reader is strict: scontrol prints `Key=value` pairs separated by spaces and never
quotes a value, and users write some values (job name, comment, paths). A job named
`x UserId=alice(1001) BatchFlag=0` must not become alice's interactive job. So a record is
cut with the key table of text_keys: a user's text ends only where the key scontrol prints
after it begins, and a record whose text imitates keys (a key twice, a key out of its place,
a key scontrol printed earlier found inside a user's text, a line break in it) is refused
with an InputError naming the job and the field, never read by guessing.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from plugins.slurm import hostlist, text_keys
from plugins.slurm.images import parse_tag, requested_image
from plugins.slurm.states import Partition, duration_s, job_state, node_state, size_mb, tres_memory_mb
from vjob import log
from vjob.errors import InputError
from vjob.model import Job, JobClass, JobState, Node

MAX_VALUE_CHARS = 65_536
"""Longest value vjob reads from one field (Slurm's own limits on names and comments are lower)."""
_CANDIDATE = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_/:.]*)=")
_NUMBER = re.compile(r"[0-9]{1,15}")


@dataclass(frozen=True)
class _Table:
    """What text_keys says about one kind of record."""

    order: tuple[str, ...]
    free_text: dict[str, tuple[str, ...]]
    required: tuple[str, ...]
    one_of: tuple[tuple[str, ...], ...] = ()
    tail: tuple[str, ...] = ()

    @property
    def known(self) -> frozenset[str]:
        return frozenset(self.order) | frozenset(self.free_text) | frozenset(self.tail)

    def rank(self, key: str) -> int | None:
        try:
            return self.order.index(key)
        except ValueError:
            return None


TABLES = {
    "JobId": _Table(
        text_keys.JOB_ORDER, text_keys.JOB_FREE_TEXT, text_keys.JOB_REQUIRED, text_keys.JOB_ONE_OF, text_keys.JOB_TAIL
    ),
    "NodeName": _Table(text_keys.NODE_ORDER, text_keys.NODE_FREE_TEXT, text_keys.NODE_REQUIRED),
    "PartitionName": _Table(text_keys.PARTITION_ORDER, text_keys.PARTITION_FREE_TEXT, text_keys.PARTITION_REQUIRED),
}


def records(text: str, first_key: str) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, fields) of each record starting with `first_key=`; InputError when a
    record's fields cannot be told apart from the text users wrote into it."""
    for number, body in _record_texts(text, first_key):
        fields, problem = split_record(body, TABLES[first_key])
        if problem:
            ident = fields.get(first_key, "?")
            raise InputError(f"line {number} ({first_key}={ident[:40]!r}): {problem}")
        yield number, fields


def _record_texts(text: str, first_key: str) -> Iterator[tuple[int, str]]:
    """Each record's text: from a line starting `first_key=` to the next one (-o: one line)."""
    start, lines = 0, []  # type: int, list[str]
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith(first_key + "="):
            if lines:
                yield start, "\n".join(lines)
            start, lines = number, [line]
        elif lines and line.strip():
            lines.append(line)
    if lines:
        yield start, "\n".join(lines)


def split_record(body: str, table: _Table) -> tuple[dict[str, str], str]:
    """The fields of one record, and '' or the reason it cannot be trusted."""
    cands = [(m.start(), m.end(), m.group(1)) for m in _CANDIDATE.finditer(body)]
    known = table.known
    fields: dict[str, str] = {}
    problems: list[str] = []
    seen_known: list[str] = []
    i = 0
    while i < len(cands):
        _, value_at, key = cands[i]
        successors = table.free_text.get(key)
        j = i + 1
        if successors is not None:  # the user's text ends where its successor key begins
            j = next((k for k in range(i + 1, len(cands)) if cands[k][2] in successors), len(cands))
        value = body[value_at : cands[j][0] if j < len(cands) else len(body)].strip()
        if len(value) > MAX_VALUE_CHARS:
            problems.append(f"{key}: value of {len(value)} characters (at most {MAX_VALUE_CHARS})")
            value = value[:MAX_VALUE_CHARS]
        if key in known:
            if key in fields:
                problems.append(f"field {key} appears twice: a user's text (job name, comment, path) imitates it")
            seen_known.append(key)
        if successors is not None:
            problems.extend(_imitations(key, value, table))
        fields.setdefault(key, value)
        i = j
    ranks = [(rank, k) for k in seen_known if (rank := table.rank(k)) is not None]
    for (r1, k1), (r2, k2) in itertools.pairwise(ranks):
        if r2 <= r1:
            problems.append(f"field {k2} comes after {k1}, out of scontrol's order: a user's text imitates it")
            break
    missing = [k for k in table.required if k not in fields]
    if missing:
        problems.append(f"missing field(s) {', '.join(missing)}: not a whole record (a line break in a user's text?)")
    for group in table.one_of:
        if sum(1 for k in group if k in fields) > 1:
            problems.append(f"both {' and '.join(group)}: a user's text imitates one of them")
    return fields, "; ".join(dict.fromkeys(problems))


def _imitations(key: str, value: str, table: _Table) -> list[str]:
    """Problems with a user-written value: a line break, or a key printed before it (or itself)."""
    out = []
    if "\n" in value or "\r" in value:
        out.append(f"{key} = {value[:60]!r} holds a line break")
    own = table.rank(key)
    for m in _CANDIDATE.finditer(value):
        other = m.group(1)
        if other not in table.known:
            continue
        rank = table.rank(other)
        if other == key or (rank is not None and (own is None or rank <= own)):
            out.append(f"{key} = {value[:60]!r} holds {other + '='!r}, a field scontrol prints before it")
            break
    return out


def _int(fields: dict[str, str], key: str, where: str, default: int = 0) -> int:
    raw = fields.get(key, "")
    if raw in ("", "N/A", "(null)"):
        return default
    value = raw.split("-")[0].split("(")[0]  # NumNodes=2-4 for a pending job: its minimum
    if not _NUMBER.fullmatch(value):
        raise InputError(f"{where}: {key}={raw[:40]!r}: expected a whole number")
    return int(value)


def _timestamp(value: str, where: str, key: str) -> float | None:
    """POSIX seconds of a scontrol time (local time, as scontrol prints it)."""
    if value in ("", "None", "Unknown", "N/A", "(null)"):
        return None
    try:
        return time.mktime(datetime.strptime(value, "%Y-%m-%dT%H:%M:%S").timetuple())
    except (ValueError, OverflowError):
        raise InputError(f"{where}: {key}={value[:40]!r}: expected a time like 2019-01-31T10:35:35") from None


def _user(value: str) -> str:
    return value.split("(")[0]


def jobs_from_scontrol(text: str, *, source: str, skipped: list[str] | None = None) -> list[Job]:
    """Jobs of `scontrol show job` text. A record that cannot be trusted raises InputError, or,
    when `skipped` is given (the live adapter), is reported there and left out: one user's
    hostile job name must not stop the agent from seeing everyone else's jobs."""
    out = []
    for line, body in _record_texts(text, "JobId"):
        fields, problem = split_record(body, TABLES["JobId"])
        where = f"{source}:{line} (job {fields.get('JobId', '?')[:20]})"
        try:
            if problem:
                raise InputError(f"{where}: {problem}")
            out.append(_job(fields, where))
        except InputError as exc:
            if skipped is None:
                raise
            skipped.append(str(exc))
    return out


def _job(fields: dict[str, str], where: str) -> Job:
    job_id = fields.get("JobId", "")
    if not _NUMBER.fullmatch(job_id):
        raise InputError(f"{where}: JobId={job_id[:40]!r}: expected a number")
    state = job_state(fields.get("JobState", ""), fields.get("Reason", ""), where=where)
    if state is JobState.PENDING and fields.get("Priority") == "0":
        state = JobState.HELD
    tag = parse_tag(fields.get("AdminComment", ""))
    try:
        comment = fields.get("Comment", "")
        os_image = tag[1] if tag else requested_image("" if comment == "(null)" else comment)
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None
    cpus = _int(fields, "NumCPUs", where, 1) or 1
    node_count = _int(fields, "NumNodes", where, 1) or 1
    cores = -(-cpus // node_count)
    running = state in (JobState.RUNNING, JobState.SUSPENDED)
    # Memory per node: asked per node, per CPU, or the job's TRES total shared by its nodes.
    if fields.get("MinMemoryNode"):
        memory = size_mb(fields["MinMemoryNode"], where=f"{where}: MinMemoryNode")
    elif fields.get("MinMemoryCPU"):
        memory = size_mb(fields["MinMemoryCPU"], where=f"{where}: MinMemoryCPU") * cores
    else:
        memory = -(-(tres_memory_mb(fields.get("TRES", ""), where=f"{where}: TRES") or 0) // node_count)
    return Job(
        id=job_id,
        user=_user(fields.get("UserId", "")),
        job_class=JobClass.INTERACTIVE if fields.get("BatchFlag") == "0" else JobClass.BATCH,
        rms="slurm",
        account=fields.get("Account", "").replace("(null)", ""),
        nodes=node_count,
        cores=cores,
        memory_mb=memory,
        os_image=os_image,
        submit_time=_timestamp(fields.get("SubmitTime", ""), where, "SubmitTime") or 0.0,
        start_time=_timestamp(fields.get("StartTime", ""), where, "StartTime") if (running or state.finished) else None,
        end_time=_timestamp(fields.get("EndTime", ""), where, "EndTime") if state.finished else None,
        walltime=duration_s(fields.get("TimeLimit", ""), where=f"{where}: TimeLimit"),
        state=state,
        allocated_nodes=hostlist.expand(fields.get("NodeList", ""), f"{where}: NodeList") if running else (),
    )


def nodes_from_scontrol(text: str, *, source: str) -> list[Node]:
    out = []
    for line, body in _record_texts(text, "NodeName"):
        fields, problem = split_record(body, TABLES["NodeName"])
        name = fields.get("NodeName", "")
        where = f"{source}:{line} (node {name[:64]})"
        if problem:
            raise InputError(f"{where}: {problem}")
        if not hostlist.NODE_NAME.fullmatch(name):
            raise InputError(f"{where}: NodeName={name[:64]!r}: not a node name")
        memory = _int(fields, "RealMemory", where, 1)
        features = fields.get("ActiveFeatures") or fields.get("AvailableFeatures") or ""
        out.append(
            Node(
                name=name,
                cpus=_int(fields, "CPUTot", where, 1) or 1,
                memory_mb=memory or 1,
                state=node_state(fields.get("State", ""), where=where),
                features=tuple(f for f in features.split(",") if f and f != "(null)"),
                weight=_int(fields, "Weight", where, 1),
            )
        )
    return out


def partitions_from_scontrol(text: str, *, source: str) -> list[Partition]:
    out = []
    for line, body in _record_texts(text, "PartitionName"):
        fields, problem = split_record(body, TABLES["PartitionName"])
        where = f"{source}:{line} (partition {fields.get('PartitionName', '?')[:64]})"
        if problem:
            raise InputError(f"{where}: {problem}")
        out.append(
            Partition(
                name=fields.get("PartitionName", ""),
                nodes=hostlist.expand(fields.get("Nodes", ""), f"{where}: Nodes"),
                total_nodes=_int(fields, "TotalNodes", where),
                total_cpus=_int(fields, "TotalCPUs", where),
                state=fields.get("State", ""),
                default=fields.get("Default") == "YES",
                priority_tier=_int(fields, "PriorityTier", where, 1),
                max_time_s=duration_s(fields.get("MaxTime", ""), where=f"{where}: MaxTime"),
                preempt_mode=fields.get("PreemptMode", ""),
            )
        )
    return out


# -- JSON lines (a site's squeue/sinfo -o '{"id": %i, ...}') ---------------------------------------
_JL_JOB_KEYS = {"id", "state"}
_JL_NODE_KEYS = {"n", "s"}


def json_lines(text: str, kind: str, *, source: str) -> list[Any]:
    """Jobs or nodes from JSON lines; a malformed line is reported and skipped, not fatal.

    Why lenient here only: a custom -o format prints a bare `xx` for a field it cannot fill
    (the recorded fixture has such lines); one bad line must not hide a whole queue. Every
    skipped line is logged with its number, and no valid line means an InputError.
    """
    out: list[Any] = []
    bad: list[str] = []
    lines = [(n, ln.strip()) for n, ln in enumerate(text.splitlines(), 1)]
    data_lines = [(n, ln) for n, ln in lines if ln and not ln.startswith("#")]
    for number, line in data_lines:
        where = f"{source}:{number}"
        try:
            item = json.loads(line)
            if not isinstance(item, dict):
                raise InputError(f"{where}: expected a JSON object")
            out.append(_jl_job(item, where) if kind == "jobs" else _jl_node(item, where))
        except (ValueError, RecursionError, InputError) as exc:  # RecursionError: [[[[...]]]] nesting
            bad.append(f"line {number}: {str(exc)[:200]}")
    if bad:
        log.get("slurm").warning("skipped malformed lines", source=source, lines=bad)
    if data_lines and not out:
        raise InputError(f"{source}: no valid line; first problem: {bad[0]}")
    return out


def _jl_job(item: dict[str, Any], where: str) -> Job:
    missing = _JL_JOB_KEYS - set(item)
    if missing:
        raise InputError(f"{where}: missing key(s) {', '.join(sorted(missing))} (expected squeue JSON lines)")
    job_id = item["id"]
    if isinstance(job_id, bool) or not isinstance(job_id, int | str) or not _NUMBER.fullmatch(str(job_id)):
        raise InputError(f"{where}: id = {str(job_id)[:40]!r}: expected a job number")
    where = f"{where} (job {job_id})"
    state = job_state(str(item["state"])[:64], str(item.get("r", ""))[:256], where=where)
    running = state in (JobState.RUNNING, JobState.SUSPENDED)
    mem = str(item.get("mem", ""))
    cpu = item.get("cpu", 1)
    if not isinstance(cpu, int) or isinstance(cpu, bool):
        raise InputError(f"{where}: cpu = {cpu!r}: expected a whole number")
    return Job(
        id=str(job_id),
        user=str(item.get("u", "")),
        rms="slurm",
        account=str(item.get("a", "")),
        cores=max(1, cpu),
        memory_mb=size_mb(mem, where=f"{where}: mem") if mem not in ("", "N/A", "0") else 0,
        state=state,
        allocated_nodes=hostlist.expand(str(item.get("r", "")), f"{where}: r") if running else (),
    )


def _jl_node(item: dict[str, Any], where: str) -> Node:
    missing = _JL_NODE_KEYS - set(item)
    if missing:
        raise InputError(f"{where}: missing key(s) {', '.join(sorted(missing))} (expected sinfo JSON lines)")
    name = str(item["n"])
    if not hostlist.NODE_NAME.fullmatch(name):
        raise InputError(f"{where}: n = {name[:64]!r}: not a node name")
    where = f"{where} (node {name})"
    cstate = str(item.get("cstate", ""))  # allocated/idle/other/total CPUs
    parts = cstate.split("/")
    if len(parts) != 4 or not all(_NUMBER.fullmatch(p) for p in parts):
        raise InputError(f"{where}: cstate = {cstate!r}: expected A/I/O/T CPU counts")
    mem = item.get("mem", 1)
    if not isinstance(mem, int) or isinstance(mem, bool):
        raise InputError(f"{where}: mem = {mem!r}: expected megabytes")
    return Node(
        name=name, cpus=max(1, int(parts[3])), memory_mb=max(1, mem), state=node_state(str(item["s"]), where=where)
    )


def merge_nodes(nodes: list[Node]) -> list[Node]:
    """One entry per node name (sinfo repeats a node once per partition)."""
    seen: dict[str, Node] = {}
    for node in nodes:
        seen.setdefault(node.name, node)
    return list(seen.values())
