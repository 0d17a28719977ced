"""Reading OAR 2.5's JSON: `oarstat -f -J` (jobs, with events) and `oarnodes -J` (resources).

Why a separate record type beside `vjob.model.Job`: Saline needs what the model does not carry
(OAR's raw state, the event log that tells a best-effort kill from a user's oardel, the
resubmission chain of idempotent jobs). `OarJob.to_job()` gives the model view for policies.
"""

from __future__ import annotations

import json
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

# What OAR writes in the event log when its scheduler kills a best-effort job for a normal one.
BESTEFFORT_KILL = "BESTEFFORT_KILL"
CHECKPOINT_EVENTS = frozenset({"CHECKPOINT", "CHECKPOINT_SUCCESSFULL", "CHECKPOINT_SUCCESS"})


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
        )


def loads(text: str, *, source: str) -> Any:
    """JSON from an OAR command; empty output means "nothing" (oarstat prints 0 bytes then).

    Some OAR 2.5 builds escape the quotes inside `wanted_resources` as `\\\\"` (a backslash
    then a string end), which is not JSON; that one known defect is repaired, nothing else.
    """
    if not text.strip():
        return {}
    try:
        return json.loads(text)
    except json.JSONDecodeError as first:
        try:
            return json.loads(text.replace('\\\\"', '\\"'))
        except json.JSONDecodeError:
            raise InputError(
                f"{source}: not valid JSON at line {first.lineno} column {first.colno}: {first.msg}"
            ) from None


def _opt_time(value: Any) -> float | None:
    if value in (None, 0, "0", ""):
        return None
    return float(value)


def _int_or_none(value: Any) -> int | None:
    if value in (None, "", "None"):
        return None
    return int(value)


def _hosts(d: dict[str, Any]) -> tuple[str, ...]:
    """oarstat: assigned_network_address; the REST API: nodes[].network_address."""
    if d.get("assigned_network_address"):
        return tuple(str(h) for h in d["assigned_network_address"])
    return tuple(str(n["network_address"]) for n in d.get("nodes") or () if "network_address" in n)


def _resources(d: dict[str, Any]) -> tuple[int, ...]:
    """oarstat: assigned_resources (ids); the REST API: resources[].id."""
    if d.get("assigned_resources"):
        return tuple(int(r) for r in d["assigned_resources"])
    return tuple(int(r["id"]) for r in d.get("resources") or () if isinstance(r, dict) and "id" in r)


def job_from_dict(key: str, d: Any, *, source: str) -> OarJob:
    """One job record; errors name the job and the field."""
    where = f"{source}: job {key}"
    if not isinstance(d, dict):
        raise InputError(f"{where}: expected an object, got {type(d).__name__}")
    try:
        state = d["state"]
    except KeyError:
        raise InputError(f"{where}: missing field 'state'") from None
    if state not in STATES:
        raise InputError(f"{where}: state = {state!r}: not an OAR job state ({', '.join(STATES)})")
    user = d.get("job_user") or d.get("owner") or d.get("user")
    if not user:
        raise InputError(f"{where}: missing field 'job_user' (or 'owner')")
    try:
        events = tuple(
            OarEvent(
                event_id=int(e.get("event_id") or e.get("id") or 0),
                type=str(e["type"]),
                date=float(e.get("date") or 0),
                description=str(e.get("description") or ""),
            )
            for e in d.get("events") or ()
        )
        resubmit = _int_or_none(d.get("resubmit_job_id"))
        walltime = d.get("walltime")
        return OarJob(
            id=str(d.get("Job_Id") or d.get("id") or key),
            state=state,
            user=str(user),
            name=str(d.get("name") or ""),
            queue=str(d.get("queue") or d.get("queue_name") or ""),
            types=tuple(str(t) for t in d.get("types") or ()),
            job_type=str(d.get("jobType") or d.get("job_type") or d.get("type") or "PASSIVE"),
            hosts=_hosts(d),
            resources=_resources(d),
            submit_time=float(d.get("submissionTime") or d.get("submission_time") or 0),
            start_time=_opt_time(d.get("startTime", d.get("start_time"))),
            stop_time=_opt_time(d.get("stopTime", d.get("stop_time"))),
            walltime=float(walltime) if walltime not in (None, "") else None,
            exit_code=_int_or_none(d.get("exit_code")),
            resubmit_job_id=str(resubmit) if resubmit else None,
            events=events,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{where}: malformed field: {exc}") from None


def parse_jobs(text: str, *, source: str) -> list[OarJob]:
    """`oarstat -f -J` output: an object keyed by job id (possibly empty)."""
    data = loads(text, source=source)
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
    return items


def nodes_from_resources(resources: list[dict[str, Any]], *, busy: set[int] | None = None) -> list[Node]:
    """Group OAR resources (cores) by host into nodes; a host is down when no core is Alive."""
    by_host: dict[str, list[dict[str, Any]]] = {}
    for r in resources:
        by_host.setdefault(str(r["network_address"]), []).append(r)
    busy = busy or set()
    nodes = []
    for host, rs in sorted(by_host.items()):
        alive = [r for r in rs if r["state"] == "Alive"]
        used = [r for r in alive if int(r.get("resource_id", r.get("id", -1))) in busy]
        if not alive:
            state = NodeState.DOWN if any(r["state"] in ("Dead", "Suspected") for r in rs) else NodeState.DRAINED
        elif not used:
            state = NodeState.IDLE
        elif len(used) == len(alive):
            state = NodeState.ALLOCATED
        else:
            state = NodeState.MIXED
        site = str(rs[0].get("site") or rs[0].get("cluster") or "default")
        memory = max(int(r.get("memnode") or 0) for r in rs) or 1024
        nodes.append(Node(name=host, cpus=len(rs), memory_mb=memory, site=site, state=state))
    return nodes
