"""Reading OAR 2.5's JSON: `oarstat -f -J` (jobs, with events) and `oarnodes -J` (resources).

Why a separate record type beside `vjob.model.Job`: Saline needs what the model does not carry
(OAR's raw state, the event log that tells a best-effort kill from a user's oardel, the
resubmission chain of idempotent jobs). `OarJob.to_job()` gives the model view for policies.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

from vjob.errors import InputError
from vjob.model import Job, JobClass, JobState, Node, NodeState

# OAR job states (oar/IO.pm) reduced to the model's.
STATES: dict[str, JobState] = {
    "Waiting": JobState.PENDING,
    "toAckReservation": JobState.PENDING,
    "Hold": JobState.HELD,
    "toLaunch": JobState.RUNNING,
    "Launching": JobState.RUNNING,
    "Running": JobState.RUNNING,
    "Finishing": JobState.RUNNING,
    "Suspended": JobState.SUSPENDED,
    "Resuming": JobState.SUSPENDED,
    "toError": JobState.FAILED,
    "Error": JobState.FAILED,
    "Terminated": JobState.COMPLETED,
}
FINAL_STATES = frozenset({"Error", "Terminated"})
HOLDING_STATES = ("toLaunch", "Launching", "Running", "Finishing", "Suspended", "Resuming")
"""The states in which a job holds its resources (a held or waiting job holds none)."""

# What OAR writes in the event log when its scheduler kills a best-effort job for a normal one.
BESTEFFORT_KILL = "BESTEFFORT_KILL"
CHECKPOINT_EVENTS = frozenset({"CHECKPOINT", "CHECKPOINT_SUCCESSFULL", "CHECKPOINT_SUCCESS"})

MAX_TEXT = 64 * 1024 * 1024
"""Largest oarstat/oarnodes/API answer read (a busy site's `oarstat -f -J` is a few MiB)."""
MAX_FIELD = 4096
"""Longest string kept from one field (names, event descriptions): OAR's own limit is 255."""
JOB_ID = re.compile(r"[0-9]{1,20}")
USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}")
HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,252}")
"""Host names as OAR's network_address holds them (names, IPv4, IPv6 without brackets)."""


@dataclass(frozen=True, slots=True)
class OarEvent:
    event_id: int
    type: str
    date: float
    description: str = ""


@dataclass(frozen=True, slots=True)
class OarJob:
    """One OAR job as `oarstat -f -J` (or GET /jobs/ID) shows it."""

    id: str
    state: str
    user: str
    name: str = ""
    queue: str = ""
    types: tuple[str, ...] = ()
    job_type: str = "PASSIVE"
    hosts: tuple[str, ...] = ()
    resources: tuple[int, ...] = ()
    submit_time: float = 0.0
    start_time: float | None = None
    stop_time: float | None = None
    walltime: float | None = None
    exit_code: int | None = None
    resubmit_job_id: str | None = None
    events: tuple[OarEvent, ...] = field(default=())

    @property
    def finished(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def besteffort(self) -> bool:
        return "besteffort" in self.types or self.queue == "besteffort"

    @property
    def killed_for_besteffort(self) -> bool:
        """OAR's scheduler took the resources back (not the user's oardel, not a walltime)."""
        return any(e.type == BESTEFFORT_KILL for e in self.events)

    @property
    def checkpoint_requested(self) -> bool:
        return any(e.type in CHECKPOINT_EVENTS for e in self.events)

    def to_job(self) -> Job:
        if self.job_type == "INTERACTIVE":
            job_class = JobClass.INTERACTIVE
        elif self.besteffort:
            job_class = JobClass.BESTEFFORT
        else:
            job_class = JobClass.BATCH
        nodes = max(1, len(self.hosts))
        state = STATES.get(self.state, JobState.PENDING)
        waiting = state in (JobState.PENDING, JobState.HELD)  # OAR shows the planned start and hosts
        return Job(
            id=self.id,
            user=self.user,
            job_class=job_class,
            rms="oar",
            nodes=nodes,
            cores=max(1, -(-len(self.resources) // nodes)),
            submit_time=self.submit_time,
            start_time=None if waiting else self.start_time,
            end_time=self.stop_time,
            walltime=self.walltime,
            state=state,
            allocated_nodes=() if waiting else self.hosts,
            deadline=job_deadline(self.types),
        )


_DEADLINE = re.compile(r"deadline=(\d{4})-(\d\d)-(\d\d)(?:\s+(\d\d):(\d\d)(?::(\d\d))?)?")
"""OAR's own deadline job type, `oarsub -t deadline=YYYY-MM-DD[ HH:MM[:SS]]` (the same grammar as
vjob's OAR deadline rule, vjob/deploy_files/oar/vjob_deadline_rule.pl)."""


def job_deadline(types: tuple[str, ...]) -> float | None:
    """The job's deadline in POSIX seconds from its `deadline=` type, read in the server's local
    time as OAR's scheduler reads it; the last such type wins, as in the admission rule. A date
    that is not one (month 13, 25:00) is ignored, not guessed: the rule accepted that job without a
    check (it fails open), so the agent does not invent a deadline for it either."""
    found = None
    for t in types:
        m = _DEADLINE.fullmatch(t)
        if m is not None:
            found = m
    if found is None:
        return None
    y, mo, d, h, mi, sec = (int(g or 0) for g in found.groups())
    if not (1 <= mo <= 12 and 1 <= d <= 31 and h < 24 and mi < 60 and sec < 60):
        return None
    stamp = time.mktime((y, mo, d, h, mi, sec, 0, 0, -1))
    if time.localtime(stamp)[:3] != (y, mo, d):  # 31 February rolled over into March
        return None
    return stamp


def loads(text: str, *, source: str) -> Any:
    """JSON from an OAR command; empty output means "nothing" (oarstat prints 0 bytes then).

    Some OAR 2.5 builds escape the quotes inside `wanted_resources` as `\\\\"` (a backslash
    then a string end), which is not JSON; that one known defect is repaired, nothing else.
    """
    if len(text) > MAX_TEXT:
        raise InputError(f"{source}: {len(text)} characters: more than the {MAX_TEXT} read")
    if not text.strip():
        return {}
    try:
        return json.loads(text)
    except RecursionError:
        raise InputError(f"{source}: JSON nested too deeply") from None
    except json.JSONDecodeError as first:
        try:
            return json.loads(text.replace('\\\\"', '\\"'))
        except RecursionError:
            raise InputError(f"{source}: JSON nested too deeply") from None
        except json.JSONDecodeError:
            raise InputError(
                f"{source}: not valid JSON at line {first.lineno} column {first.colno}: {first.msg}"
            ) from None


def _number(field_name: str, value: Any) -> float:
    """A finite number from a JSON number or numeric string (bool, list, NaN: refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{field_name} = {_short(value)}: not a number")
    if isinstance(value, str) and len(value) > 32:
        raise ValueError(f"{field_name} = {_short(value)}: not a number")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{field_name} = {_short(value)}: not a finite number")
    return out


def _integer(field_name: str, value: Any) -> int:
    out = _number(field_name, value)
    if out != int(out):
        raise ValueError(f"{field_name} = {_short(value)}: not an integer")
    return int(out)


def _text(field_name: str, value: Any) -> str:
    """A string field (numbers accepted as OAR prints some ids as numbers), size-limited."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{field_name} = {_short(value)}: not a string")
    out = str(value)
    if len(out) > MAX_FIELD:
        raise ValueError(f"{field_name}: {len(out)} characters, more than {MAX_FIELD}")
    return out


def _word(field_name: str, value: Any, grammar: re.Pattern[str]) -> str:
    out = _text(field_name, value)
    if not grammar.fullmatch(out):
        raise ValueError(f"{field_name} = {_short(out)}: not a valid {field_name}")
    return out


def _list(field_name: str, value: Any) -> list[Any]:
    if value in (None, ""):
        return []
    if not isinstance(value, list):
        raise ValueError(f"{field_name} = {_short(value)}: not a list")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _opt_time(field_name: str, value: Any) -> float | None:
    if value in (None, 0, "0", ""):
        return None
    return _number(field_name, value)


def _int_or_none(field_name: str, value: Any) -> int | None:
    if value in (None, "", "None"):
        return None
    return _integer(field_name, value)


def _hosts(d: dict[str, Any]) -> tuple[str, ...]:
    """oarstat: assigned_network_address; the REST API: nodes[].network_address."""
    if d.get("assigned_network_address"):
        return tuple(_word("host", h, HOST) for h in _list("assigned_network_address", d["assigned_network_address"]))
    return tuple(
        _word("host", n["network_address"], HOST)
        for n in _list("nodes", d.get("nodes"))
        if isinstance(n, dict) and "network_address" in n
    )


def _resources(d: dict[str, Any]) -> tuple[int, ...]:
    """oarstat: assigned_resources (ids); the REST API: resources[].id."""
    if d.get("assigned_resources"):
        return tuple(_integer("assigned_resources", r) for r in _list("assigned_resources", d["assigned_resources"]))
    return tuple(
        _integer("resources.id", r["id"])
        for r in _list("resources", d.get("resources"))
        if isinstance(r, dict) and "id" in r
    )


def _event(e: Any) -> OarEvent:
    if not isinstance(e, dict):
        raise ValueError(f"events: {_short(e)}: not an object")
    if "type" not in e:
        raise ValueError("events: an event without 'type'")
    return OarEvent(
        event_id=_integer("event_id", e.get("event_id") or e.get("id") or 0),
        type=_text("events.type", e["type"]),
        date=_number("events.date", e.get("date") or 0),
        description=_text("events.description", e.get("description") or ""),
    )


def job_from_dict(key: str, d: Any, *, source: str) -> OarJob:
    """One job record; errors name the job and the field."""
    where = f"{source}: job {key}"
    if not isinstance(d, dict):
        raise InputError(f"{where}: expected an object, got {type(d).__name__}")
    try:
        state = d["state"]
    except KeyError:
        raise InputError(f"{where}: missing field 'state'") from None
    if not isinstance(state, str) or state not in STATES:
        raise InputError(f"{where}: state = {_short(state)}: not an OAR job state ({', '.join(STATES)})")
    user = d.get("job_user") or d.get("owner") or d.get("user")
    if not user:
        raise InputError(f"{where}: missing field 'job_user' (or 'owner')")
    try:
        # In the order OAR logged them: neither oarstat nor the API promises an order.
        events = tuple(sorted((_event(e) for e in _list("events", d.get("events"))), key=lambda e: e.event_id))
        resubmit = _int_or_none("resubmit_job_id", d.get("resubmit_job_id"))
        walltime = d.get("walltime")
        return OarJob(
            id=_word("job id", d.get("Job_Id") or d.get("id") or key, JOB_ID),
            state=state,
            user=_word("user", user, USER),
            name=_text("name", d.get("name") or ""),
            queue=_text("queue", d.get("queue") or d.get("queue_name") or ""),
            types=tuple(_text("types", t) for t in _list("types", d.get("types"))),
            job_type=_text("jobType", d.get("jobType") or d.get("job_type") or d.get("type") or "PASSIVE"),
            hosts=_hosts(d),
            resources=_resources(d),
            submit_time=_number("submissionTime", d.get("submissionTime") or d.get("submission_time") or 0),
            start_time=_opt_time("startTime", d.get("startTime", d.get("start_time"))),
            stop_time=_opt_time("stopTime", d.get("stopTime", d.get("stop_time"))),
            walltime=_number("walltime", walltime) if walltime not in (None, "") else None,
            exit_code=_int_or_none("exit_code", d.get("exit_code")),
            resubmit_job_id=str(resubmit) if resubmit else None,
            events=events,
        )
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise InputError(f"{where}: malformed field: {exc}") from None


def parse_jobs(text: str, *, source: str) -> list[OarJob]:
    """`oarstat -f -J` output: an object keyed by job id (possibly empty)."""
    data = loads(text, source=source)
    if isinstance(data, list) and not data:
        return []  # some OAR versions print [] for no jobs
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a JSON object keyed by job id, got {type(data).__name__}")
    return [job_from_dict(str(k), v, source=source) for k, v in data.items()]


def parse_resources(text: str, *, source: str) -> list[dict[str, Any]]:
    """`oarnodes -J` output: an object keyed by resource id (or a list, as the REST API gives)."""
    return resources_from_data(loads(text, source=source), source=source)


def resources_from_data(data: Any, *, source: str) -> list[dict[str, Any]]:
    """Resources from decoded JSON: oarnodes' object keyed by id, or the API's `items` list."""
    if isinstance(data, dict) and "items" in data:
        data = data["items"]
    if isinstance(data, dict):
        items = list(data.values())
    elif isinstance(data, list):
        items = data
    else:
        raise InputError(f"{source}: expected a JSON object keyed by resource id, got {type(data).__name__}")
    for i, r in enumerate(items):
        if not isinstance(r, dict) or "network_address" not in r or "state" not in r:
            raise InputError(f"{source}: resource #{i}: expected an object with 'network_address' and 'state'")
        try:
            _word("network_address", r["network_address"], HOST)
            _text("state", r["state"])
            for name in ("resource_id", "id"):
                if name in r:
                    _integer(name, r[name])
            if r.get("memnode") not in (None, ""):
                _integer("memnode", r["memnode"])
            for name in ("site", "cluster"):
                if r.get(name) not in (None, ""):
                    _text(name, r[name])
        except (ValueError, OverflowError) as exc:
            raise InputError(f"{source}: resource #{i}: {exc}") from None
    return items


def resource_id(resource: dict[str, Any]) -> int:
    """The id of a resource checked by `resources_from_data` (-1 when it has none)."""
    return _integer("resource_id", resource.get("resource_id", resource.get("id", -1)))


def nodes_from_resources(resources: list[dict[str, Any]], *, busy: set[int] | None = None) -> list[Node]:
    """Group OAR resources (cores) by host into nodes; a host is down when no core is Alive."""
    by_host: dict[str, list[dict[str, Any]]] = {}
    for r in resources:
        by_host.setdefault(str(r["network_address"]), []).append(r)
    busy = busy or set()
    nodes = []
    for host, rs in sorted(by_host.items()):
        alive = [r for r in rs if r["state"] == "Alive"]
        used = [r for r in alive if resource_id(r) in busy]
        if not alive:
            state = NodeState.DOWN if any(r["state"] in ("Dead", "Suspected") for r in rs) else NodeState.DRAINED
        elif not used:
            state = NodeState.IDLE
        elif len(used) == len(alive):
            state = NodeState.ALLOCATED
        else:
            state = NodeState.MIXED
        site = str(rs[0].get("site") or rs[0].get("cluster") or "default")
        memory = max(_integer("memnode", r.get("memnode") or 0) for r in rs) or 1024
        # OAR's `cluster` property names a homogeneous group of nodes: the node's kind
        # (a sub-cluster for remapping, preemption.remap.models.subcluster_of).
        kinds = tuple(dict.fromkeys(str(r["cluster"]) for r in rs if r.get("cluster") not in (None, "")))
        nodes.append(Node(name=host, cpus=len(rs), memory_mb=memory, site=site, state=state, features=kinds))
    return nodes
