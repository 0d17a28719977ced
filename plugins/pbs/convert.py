"""Flat PBS attribute records (plugins.pbs.records) → vjob Jobs and Nodes.

Why one converter for Torque, OpenPBS and Moab: the attribute names are shared (Torque and
OpenPBS both descend from OpenPBS 2.3), so the rules that matter to the policies — which job
is interactive, which OS it wants, which OS a node runs (UBIS's VM_os), how many cores and
how much memory — are written once and documented once (docs/pbs.md).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from plugins.pbs import names
from plugins.pbs.records import Record
from plugins.pbs.units import duration_s, size_mb
from vjob.errors import InputError
from vjob.model import Job, JobClass, JobState, Node, NodeState

__all__ = ["Conventions", "duration_s", "exec_hosts", "parse_nodes_spec", "size_mb", "to_job"]

RMS = "pbs"
OS_VARIABLE = "VJOB_OS"
UNKNOWN_MEMORY_MB = 1
"""Memory of a node whose pbs_mom sends no status (a down node): the model needs >= 1."""


@dataclass(frozen=True)
class Conventions:
    """A site's naming conventions, from the [pbs] configuration section."""

    interactive_queues: tuple[str, ...] = ("interactive",)
    besteffort_queues: tuple[str, ...] = ()
    os_property_prefix: str = "os_"


# Torque and OpenPBS job states (qstat man pages). E (exiting) still holds its nodes.
_JOB_STATES = {
    "Q": JobState.PENDING,
    "W": JobState.PENDING,
    "T": JobState.PENDING,
    "H": JobState.HELD,
    "R": JobState.RUNNING,
    "E": JobState.RUNNING,
    "B": JobState.RUNNING,
    "S": JobState.SUSPENDED,
    "U": JobState.SUSPENDED,
    "C": JobState.COMPLETED,
    "F": JobState.COMPLETED,
    "X": JobState.COMPLETED,
    "M": JobState.COMPLETED,
}
QDEL_EXIT = 271
"""Exit status Torque and OpenPBS record for a job killed by qdel (256 + SIGTERM)."""


def timestamp(value: object, *, where: str) -> float:
    """POSIX seconds of an epoch number (Torque XML) or a ctime date (text and JSON forms).

    The ctime form carries no zone: it is read in the local zone of the process, which for
    the agent is the zone of the site whose server printed it.
    """
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < MAX_EPOCH:
        return float(value)
    text = str(value).strip()[:80] if isinstance(value, str | int | float) else repr(value)[:80]
    if _EPOCH.fullmatch(text) and float(text) < MAX_EPOCH:
        return float(text)
    date = _CTIME.fullmatch(text)
    if date and date.group(1) in _MONTHS:
        month, day, hour, minute, second, year = date.group(1), *(int(g) for g in date.groups()[1:])
        fields = (year, _MONTHS[month], day, hour, minute, second, 0, 0, -1)
        try:
            return time.mktime(fields)
        except (OverflowError, ValueError):
            pass  # a day or hour out of range on this platform: the error below
    raise InputError(f"{where} = {text!r}: not an epoch or a date like 'Tue Sep  9 10:27:01 2014'")


MAX_EPOCH = 1e11
"""Year 5138: a later "epoch" is garbage (and would overflow the date arithmetic downstream)."""
_EPOCH = re.compile(r"[0-9]{1,12}(\.[0-9]{1,9})?")
_CTIME = re.compile(r"[A-Z][a-z]{2} +([A-Z][a-z]{2}) +([0-9]{1,2}) ([0-9]{1,2}):([0-9]{2}):([0-9]{2}) ([0-9]{4})")


_MONTHS = {
    m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1)
}


_INTEGER = re.compile(r"-?[0-9]{1,18}")


def _int(value: object, *, where: str) -> int:
    """A decimal integer of at most 18 digits (ASCII only: no `1_000`, `²` or 5000-digit strings)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 10**18:
        return value
    text = value.strip() if isinstance(value, str) else None
    if text is None or not _INTEGER.fullmatch(text):
        shown = repr(value)
        raise InputError(f"{where} = {shown if len(shown) <= 80 else shown[:77] + '...'}: not an integer")
    return int(text)


MAX_COUNT = 1 << 24
"""More nodes or cores per node than any cluster has: garbage, not a request."""


@dataclass(frozen=True)
class NodeSpec:
    """What a Torque `-l nodes=` request asks for: node count, total cores, properties."""

    nodes: int
    cores: int
    properties: tuple[str, ...]


def parse_nodes_spec(spec: str, *, where: str) -> NodeSpec:
    """Read `2:ppn=20:ivybridge+node07:ppn=4` (a count or a host name, then options)."""
    nodes = cores = 0
    properties: list[str] = []
    for part in spec.split("+"):
        tokens = [t for t in part.split(":") if t]
        if not tokens:
            raise InputError(f"{where} = {spec!r}: empty part between '+' signs")
        count, ppn = 1, 1
        options = tokens
        if tokens[0].isascii() and tokens[0].isdigit():
            count, options = _int(tokens[0], where=f"{where} count"), tokens[1:]
        for token in options:
            key, eq, value = token.partition("=")
            if not eq:
                properties.append(token)  # a property, or a host name given instead of a count
            elif key == "ppn":
                ppn = _int(value, where=f"{where} ppn")
        if not (1 <= count <= MAX_COUNT and 1 <= ppn <= MAX_COUNT):
            raise InputError(f"{where} = {spec[:80]!r}: node count and ppn must be in 1..{MAX_COUNT}")
        nodes += count
        cores += count * ppn
    return NodeSpec(nodes=nodes, cores=cores, properties=tuple(dict.fromkeys(properties)))


_EXEC_HOST = re.compile(r"(?:^|\+)\s*([^+/\s]+)")


def exec_hosts(value: str, *, where: str = "exec_host") -> tuple[str, ...]:
    """Node names of `exec_host` ("r7i3n1/0+r7i3n1/1", "charon24/0*2+charon21/0*2"), in order."""
    hosts = tuple(dict.fromkeys(_EXEC_HOST.findall(value)))
    for host in hosts:
        names.node(host, field=where)
    return hosts


def variables(record: Record, *, where: str) -> dict[str, str]:
    """The job's Variable_List as a dict (records.py already split the text forms)."""
    value = record.get("Variable_List")
    if value is None or value == "":
        return {}
    if not isinstance(value, dict):
        raise InputError(f"{where}: Variable_List is {type(value).__name__}, expected KEY=VALUE pairs")
    return value


def job_class(record: Record, conventions: Conventions) -> JobClass:
    """Interactive when submitted with `qsub -I` (the server sets `interactive`), else by the
    operator's queue lists, else batch.

    Never from the user's word: `VJOB_CLASS` in the Variable_List is whatever the user's
    environment (`qsub -V`), `-v` list or a later `qalter -v` put there, so it is ignored here,
    exactly as Slurm's class comes from salloc/srun and the partition, not from the job.
    """
    if str(record.get("interactive", "")).strip().lower() in ("true", "1"):
        return JobClass.INTERACTIVE
    queue = str(record.get("queue", "")).strip()
    if queue in conventions.interactive_queues:
        return JobClass.INTERACTIVE
    if queue in conventions.besteffort_queues:
        return JobClass.BESTEFFORT
    return JobClass.BATCH


_SELECT_AOE = re.compile(r"(?:^|:)aoe=([^:+]+)")
"""An AOE asked for in a `-l select=` chunk (`1:ncpus=2:aoe=rocky9`)."""


def job_os(record: Record, properties: Iterable[str], conventions: Conventions) -> str:
    """The OS image a job asks for: the filter/hook tag, an OpenPBS `aoe` (job-wide or in a
    select chunk), or a Torque node property."""
    tag = str((record.get("Variable_List") or {}).get(OS_VARIABLE, "")).strip()
    if names.is_os_image(tag) and tag.lower() != "off":  # off: the user's opt-out, no image
        return tag  # an ill-formed name (a later `qalter -v`) is ignored, never passed on
    for key in ("Resource_List.aoe", "Resource_List.vjob_os"):
        value = str(record.get(key) or "").strip()
        if names.is_os_image(value):
            return value
    chunk_aoe = _SELECT_AOE.search(str(record.get("Resource_List.select", "")))
    if chunk_aoe and names.is_os_image(chunk_aoe.group(1)):
        return chunk_aoe.group(1)
    prefix = conventions.os_property_prefix
    for prop in properties:
        if prefix and prop.startswith(prefix) and len(prop) > len(prefix):
            return prop[len(prefix) :]
    return ""


DEADLINE_VARIABLE = "VJOB_DEADLINE"
_DEADLINE = re.compile(r"[0-9]{1,12}")


def job_deadline(record: Record) -> float | None:
    """The deadline the user gave (`qsub -v VJOB_DEADLINE=EPOCH`, what the queuejob hook checks),
    or None: anything but plain digits is ignored, as the hook ignores it (docs/deadline.md)."""
    text = str((record.get("Variable_List") or {}).get(DEADLINE_VARIABLE, "")).strip()
    return float(text) if _DEADLINE.fullmatch(text) else None


def job_state(record: Record, *, where: str) -> JobState:
    code = str(record.get("job_state", "")).strip()
    if code not in _JOB_STATES:
        raise InputError(f"{where}: job_state = {code!r}: must be one of {', '.join(_JOB_STATES)}")
    state = _JOB_STATES[code]
    if state is JobState.COMPLETED:
        status = record.get("exit_status", record.get("Exit_status"))
        if status is not None and str(status).strip():
            code_value = _int(status, where=f"{where}: exit_status")
            if code_value == QDEL_EXIT:
                return JobState.CANCELLED
            if code_value != 0:
                return JobState.FAILED
    return state


def _account(record: Record) -> str:
    """Torque's Account_Name, else the OpenPBS project (its built-in default is no account)."""
    account = str(record.get("Account_Name") or record.get("project") or "").strip()
    return "" if account == "_pbs_project_default" else account


def to_job(record: Record, conventions: Conventions, *, source: str) -> Job:
    """A vjob Job from one qstat record (Torque XML/text or OpenPBS JSON)."""
    job_id = str(record.get("Job_Id", "")).strip()
    if not job_id:
        raise InputError(f"{source}: a job record without Job_Id")
    names.job_id(job_id, field=f"{source}: Job_Id")
    where = f"{source}: job {job_id}"
    owner = str(record.get("euser") or record.get("Job_Owner", "")).split("@", 1)[0].strip()
    if not owner:
        raise InputError(f"{where}: no Job_Owner")
    names.user(owner, field=f"{where}: Job_Owner")
    record["Variable_List"] = variables(record, where=where)
    spec = NodeSpec(nodes=1, cores=1, properties=())
    if record.get("Resource_List.nodes"):
        spec = parse_nodes_spec(str(record["Resource_List.nodes"]), where=f"{where}: Resource_List.nodes")
    nodes = (
        _int(record["Resource_List.nodect"], where=f"{where}: Resource_List.nodect")
        if record.get("Resource_List.nodect")
        else spec.nodes
    )
    cores = spec.cores
    if record.get("Resource_List.procs"):
        cores = _int(record["Resource_List.procs"], where=f"{where}: Resource_List.procs")
    elif record.get("Resource_List.ncpus") and not record.get("Resource_List.nodes"):
        cores = _int(record["Resource_List.ncpus"], where=f"{where}: Resource_List.ncpus")
    cores = max(cores, 1)
    memory = 0
    if record.get("Resource_List.mem"):
        memory = size_mb(str(record["Resource_List.mem"]), where=f"{where}: Resource_List.mem")
    elif record.get("Resource_List.pmem"):
        memory = cores * size_mb(str(record["Resource_List.pmem"]), where=f"{where}: Resource_List.pmem")
    state = job_state(record, where=where)
    submitted = record.get("qtime") or record.get("ctime")
    started = record.get("start_time") or record.get("stime")
    ended = record.get("comp_time") or record.get("obittime")
    walltime = record.get("Resource_List.walltime")
    hosts = exec_hosts(str(record["exec_host"]), where=f"{where}: exec_host") if record.get("exec_host") else ()
    return Job(
        id=job_id,
        user=owner,
        job_class=job_class(record, conventions),
        rms=RMS,
        account=_account(record),
        nodes=max(nodes, 1),
        cores=cores,
        memory_mb=memory,
        os_image=job_os(record, spec.properties, conventions),
        submit_time=timestamp(submitted, where=f"{where}: qtime") if submitted else 0.0,
        start_time=timestamp(started, where=f"{where}: start_time") if started else None,
        end_time=timestamp(ended, where=f"{where}: comp_time") if ended else None,
        walltime=duration_s(str(walltime), where=f"{where}: Resource_List.walltime") if walltime else None,
        state=state,
        allocated_nodes=hosts if state in (JobState.RUNNING, JobState.SUSPENDED) else (),
        deadline=job_deadline(record),
    )


# -- nodes ----------------------------------------------------------------------------------------

_DOWN = {"down", "unknown", "state-unknown", "stale", "unresolvable", "sleep"}
_DRAINED = {"offline", "maintenance", "provisioning", "wait-provisioning"}
_BUSY = {"job-exclusive", "job-busy", "busy", "reserve", "resv-exclusive"}


def node_state(states: str, has_jobs: bool, *, where: str) -> NodeState:
    """Reduce a comma-separated Torque/OpenPBS node state list to one NodeState."""
    parts = {s.strip().lower() for s in states.split(",") if s.strip()}
    known = _DOWN | _DRAINED | _BUSY | {"free", "job-sharing", "time-shared"}
    unknown = parts - known
    if not parts or unknown:
        raise InputError(f"{where}: state = {states!r}: unknown node state {', '.join(sorted(unknown)) or '(empty)'}")
    if parts & _DOWN:
        return NodeState.DOWN
    if parts & _DRAINED:
        return NodeState.DRAINED
    if parts & _BUSY:
        return NodeState.ALLOCATED
    if has_jobs or parts & {"job-sharing", "time-shared"}:
        return NodeState.MIXED
    return NodeState.IDLE


def _status(record: Record) -> dict[str, str]:
    """The `status` attribute of Torque's pbs_mom: comma-separated key=value pairs."""
    text = str(record.get("status", ""))
    out: dict[str, str] = {}
    for item in re.split(r",(?=[a-z_]+=)", text):
        key, eq, value = item.partition("=")
        if eq:
            out[key.strip()] = value
    return out


def node_os(properties: Iterable[str], conventions: Conventions) -> str:
    prefix = conventions.os_property_prefix
    for prop in properties:
        if prefix and prop.startswith(prefix) and len(prop) > len(prefix):
            return prop[len(prefix) :]
    return ""


def torque_node(record: Record, conventions: Conventions, *, source: str) -> Node:
    """A Node from one `pbsnodes` record of Torque (XML or text)."""
    name = str(record.get("name", "")).strip()
    where = f"{source}: node {name or '?'}"
    if not name:
        raise InputError(f"{source}: a node record without a name")
    names.node(name, field=f"{source}: node name")
    if "np" not in record:
        raise InputError(f"{where}: no np (number of processors)")
    status = _status(record)
    memory = UNKNOWN_MEMORY_MB
    if status.get("physmem"):
        memory = max(1, size_mb(status["physmem"], where=f"{where}: status physmem"))
    properties = tuple(p for p in str(record.get("properties", "")).split(",") if p)
    has_jobs = bool(str(record.get("jobs", "")).strip())
    return Node(
        name=name,
        cpus=max(1, _int(record["np"], where=f"{where}: np")),
        memory_mb=memory,
        os_image=node_os(properties, conventions),
        state=node_state(str(record.get("state", "")), has_jobs, where=where),
        features=properties,
    )


def openpbs_node(record: Record, conventions: Conventions, *, source: str) -> Node:
    """A Node from one `pbsnodes -av -F json` vnode: OS from current_aoe, features from booleans."""
    name = names.node(str(record.get("name", "")).strip(), field=f"{source}: node name")
    where = f"{source}: node {name}"
    cpus = record.get("resources_available.ncpus", record.get("pcpus"))
    if cpus is None:
        raise InputError(f"{where}: neither resources_available.ncpus nor pcpus")
    memory = UNKNOWN_MEMORY_MB
    if record.get("resources_available.mem"):
        memory = max(1, size_mb(str(record["resources_available.mem"]), where=f"{where}: resources_available.mem"))
    features = tuple(
        key.split(".", 1)[1]
        for key, value in record.items()
        if key.startswith("resources_available.") and (value is True or str(value) == "True")
    )
    properties = features + tuple(
        f"{conventions.os_property_prefix}{aoe}"
        for aoe in str(record.get("resources_available.aoe", "")).split(",")
        if aoe and conventions.os_property_prefix
    )
    jobs = record.get("jobs")
    has_jobs = bool(jobs) if not isinstance(jobs, str) else bool(jobs.strip())
    return Node(
        name=name,
        cpus=max(1, _int(cpus, where=f"{where}: ncpus")),
        memory_mb=memory,
        site=str(record.get("resources_available.site", "") or "default"),
        os_image=str(record.get("current_aoe") or "") or node_os(properties, conventions),
        state=node_state(str(record.get("state", "")), has_jobs, where=where),
        features=features,
    )


# -- Moab ---------------------------------------------------------------------------------------------

_MOAB_JOB_STATES = {
    "running": JobState.RUNNING,
    "starting": JobState.RUNNING,
    "canceling": JobState.RUNNING,
    "idle": JobState.PENDING,
    "deferred": JobState.PENDING,
    "batchhold": JobState.HELD,
    "systemhold": JobState.HELD,
    "userhold": JobState.HELD,
    "hold": JobState.HELD,
    "notqueued": JobState.PENDING,
    "suspended": JobState.SUSPENDED,
    "completed": JobState.COMPLETED,
    "removed": JobState.CANCELLED,
    "vacated": JobState.PENDING,
}
_MOAB_NODE_STATES = {
    "idle": NodeState.IDLE,
    "running": NodeState.MIXED,
    "busy": NodeState.ALLOCATED,
    "reserved": NodeState.ALLOCATED,
    "drained": NodeState.DRAINED,
    "draining": NodeState.DRAINED,
    "flush": NodeState.DRAINED,
    "down": NodeState.DOWN,
    "unknown": NodeState.DOWN,
}


def moab_job(record: Record, *, source: str, year: int) -> Job:
    """A Job from one showq row. showq prints no year and no node count: `year` is supplied."""
    where = f"{source}:{record['line']}: job {record['id']}"
    names.job_id(record["id"], field=f"{source}:{record['line']}: JOBID")
    names.user(record["user"], field=f"{where}: USERNAME")
    state_word = record["state"].lower()
    if state_word not in _MOAB_JOB_STATES:
        raise InputError(f"{where}: STATE = {record['state']!r}: not a Moab job state")
    state = _MOAB_JOB_STATES[state_word]
    try:
        when = time.mktime(
            datetime.strptime(f"{year} {' '.join(record['when'].split())}", "%Y %a %b %d %H:%M:%S").timetuple()
        )
    except ValueError:
        raise InputError(f"{where}: time = {record['when']!r}: not a date like 'Fri Sep 12 10:57:10'") from None
    running = record["section"] == "active"
    limit = duration_s(record["time"].lstrip("-"), where=f"{where}: WCLIMIT") if not running else None
    return Job(
        id=record["id"],
        user=record["user"],
        rms=RMS,
        cores=max(1, _int(record["procs"], where=f"{where}: PROCS")),
        state=state,
        submit_time=0.0 if running else when,
        start_time=when if running else None,
        walltime=limit,
    )


def moab_node(record: Record, conventions: Conventions, *, source: str) -> Node:
    """A Node from one checknode record; Moab's node OS (Opsys) is UBIS's VM_os."""
    name = names.node(record["NODEID"], field=f"{source}: NODEID")
    where = f"{source}: node {name}"
    state_word = str(record.get("NODESTATE", "")).lower()
    if state_word not in _MOAB_NODE_STATES:
        raise InputError(f"{where}: State = {record.get('NODESTATE')!r}: not a Moab node state")
    features = tuple(f for f in str(record.get("FEATURES", "")).split(",") if f)
    return Node(
        name=name,
        cpus=max(1, _int(record.get("RCPROC", "0"), where=f"{where}: PROCS")),
        memory_mb=max(1, _int(record.get("RCMEM", "0"), where=f"{where}: MEM")),
        os_image=str(record.get("OS", "")),
        state=_MOAB_NODE_STATES[state_word],
        features=features,
    )
