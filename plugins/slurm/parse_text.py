"""Slurm's text outputs: `scontrol show job|node|partition` (multi-line or -o) and JSON lines.

Why text at all: `scontrol` has no --json before 23.02, squeue/sinfo have none before 20.11,
and newer JSON layouts are not read (parse_json refuses them): `scontrol show ... -o` is the
one output every Slurm version prints the same way, so it is the adapter's fallback.
JSON lines are what sites print with a custom `squeue -o '{"id": %i, ...}'` format.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from plugins.slurm import hostlist
from plugins.slurm.images import parse_tag, requested_image
from plugins.slurm.states import Partition, duration_s, job_state, node_state, size_mb, tres_memory_mb
from vjob import log
from vjob.errors import InputError
from vjob.model import Job, JobClass, JobState, Node

_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_/:.]*=")


def records(text: str, first_key: str) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, fields) of each record starting with `first_key=`.

    A token without '=' belongs to the previous value (values such as Reason or Comment may
    hold spaces); the first occurrence of a key wins (the -d detail lines repeat Nodes=).
    """
    current: dict[str, str] | None = None
    start = 0
    last_key = ""
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith(first_key + "="):
            if current is not None:
                yield start, current
            current, start, last_key = {}, number, ""
        if current is None:
            continue
        for token in stripped.split():
            if _KEY.match(token):
                key, _, value = token.partition("=")
                if key not in current:
                    current[key] = value
                    last_key = key
                else:
                    last_key = ""
            elif last_key:
                current[last_key] += " " + token
    if current is not None:
        yield start, current


def _int(fields: dict[str, str], key: str, where: str, default: int = 0) -> int:
    raw = fields.get(key, "")
    if raw in ("", "N/A", "(null)"):
        return default
    value = raw.split("-")[0].split("(")[0]  # NumNodes=2-4 for a pending job: its minimum
    if not value.isdigit():
        raise InputError(f"{where}: {key}={raw!r}: expected a whole number")
    return int(value)


def _timestamp(value: str, where: str, key: str) -> float | None:
    """POSIX seconds of a scontrol time (local time, as scontrol prints it)."""
    if value in ("", "None", "Unknown", "N/A", "(null)"):
        return None
    try:
        return time.mktime(datetime.strptime(value, "%Y-%m-%dT%H:%M:%S").timetuple())
    except ValueError:
        raise InputError(f"{where}: {key}={value!r}: expected a time like 2019-01-31T10:35:35") from None


def _user(value: str) -> str:
    return value.split("(")[0]


def jobs_from_scontrol(text: str, *, source: str) -> list[Job]:
    out = []
    for line, fields in records(text, "JobId"):
        where = f"{source}:{line} (job {fields.get('JobId', '?')})"
        out.append(_job(fields, where))
    return out


def _job(fields: dict[str, str], where: str) -> Job:
    job_id = fields.get("JobId", "")
    if not job_id.isdigit():
        raise InputError(f"{where}: JobId={job_id!r}: expected a number")
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
        allocated_nodes=hostlist.expand(fields.get("NodeList", "")) if running else (),
    )


def nodes_from_scontrol(text: str, *, source: str) -> list[Node]:
    out = []
    for line, fields in records(text, "NodeName"):
        name = fields.get("NodeName", "")
        where = f"{source}:{line} (node {name})"
        memory = _int(fields, "RealMemory", where, 1)
        features = fields.get("ActiveFeatures") or fields.get("AvailableFeatures") or ""
        out.append(
            Node(
                name=name,
                cpus=_int(fields, "CPUTot", where, 1) or 1,
                memory_mb=memory or 1,
                state=node_state(fields.get("State", ""), where=where),
                features=tuple(f for f in features.split(",") if f and f != "(null)"),
            )
        )
    return out


def partitions_from_scontrol(text: str, *, source: str) -> list[Partition]:
    out = []
    for line, fields in records(text, "PartitionName"):
        where = f"{source}:{line} (partition {fields.get('PartitionName', '?')})"
        out.append(
            Partition(
                name=fields.get("PartitionName", ""),
                nodes=hostlist.expand(fields.get("Nodes", "")),
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
        except (ValueError, InputError) as exc:
            bad.append(f"line {number}: {exc}")
    if bad:
        log.get("slurm").warning("skipped malformed lines", source=source, lines=bad)
    if data_lines and not out:
        raise InputError(f"{source}: no valid line; first problem: {bad[0]}")
    return out


def _jl_job(item: dict[str, Any], where: str) -> Job:
    missing = _JL_JOB_KEYS - set(item)
    if missing:
        raise InputError(f"{where}: missing key(s) {', '.join(sorted(missing))} (expected squeue JSON lines)")
    where = f"{where} (job {item['id']})"
    state = job_state(str(item["state"]), str(item.get("r", "")), where=where)
    running = state in (JobState.RUNNING, JobState.SUSPENDED)
    mem = str(item.get("mem", ""))
    cpu = item.get("cpu", 1)
    if not isinstance(cpu, int) or isinstance(cpu, bool):
        raise InputError(f"{where}: cpu = {cpu!r}: expected a whole number")
    return Job(
        id=str(item["id"]),
        user=str(item.get("u", "")),
        rms="slurm",
        account=str(item.get("a", "")),
        cores=max(1, cpu),
        memory_mb=size_mb(mem, where=f"{where}: mem") if mem not in ("", "N/A", "0") else 0,
        state=state,
        allocated_nodes=hostlist.expand(str(item.get("r", ""))) if running else (),
    )


def _jl_node(item: dict[str, Any], where: str) -> Node:
    missing = _JL_NODE_KEYS - set(item)
    if missing:
        raise InputError(f"{where}: missing key(s) {', '.join(sorted(missing))} (expected sinfo JSON lines)")
    name = str(item["n"])
    where = f"{where} (node {name})"
    cstate = str(item.get("cstate", ""))  # allocated/idle/other/total CPUs
    parts = cstate.split("/")
    if len(parts) != 4 or not all(p.isdigit() for p in parts):
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
