"""What the pilot's state file and the agent's request file hold: the records, and their
reading from JSON as hostile data (every field type-checked, bounded, named in the refusal)."""

from __future__ import annotations

import math
import os
import re
import time
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from typing import Any

from vjob.errors import InputError

NAME = re.compile(r"[A-Za-z0-9_.@:\-]{0,128}")
MAX_HISTORY = 1000
MAX_TEXT = 4096


class PilotState(StrEnum):
    """What the pilot of a vjob is doing, as it last wrote it."""

    STARTING = "starting"
    RUNNING = "running"
    SAVING = "saving"
    SAVED = "saved"
    RESTORING = "restoring"
    FINISHED = "finished"
    FAILED = "failed"


@dataclass(frozen=True)
class PilotStatus:
    """The content of state.json."""

    job_id: str
    vm: str
    node: str
    uri: str
    state: PilotState
    since: float
    pid: int = 0
    image: str = ""
    memory_mb: int = 0
    boots: int = 0
    restores: int = 0
    local_restores: int = 0
    saved_node: str = ""
    saved_nodes: list[str] = field(default_factory=list)
    """Every node the job held when it was checkpointed (from the agent's request)."""
    member_nodes: list[str] = field(default_factory=list)
    """A multi-node job: the node of each of its VMs (the first VM's first), written at the
    pilot's start and at each save: where a resume copies each state from, and where the
    control loop measures each VM (agent.consolidate); [] for a job of one VM."""
    console_bytes_at_save: int = 0
    """Size of the console log when the VM was last saved: what the guest printed before."""
    output_bytes_at_save: list[int] = field(default_factory=list)
    """A real job's stdout and stderr logs: bytes copied to the job's output files when the VM
    was last saved (all the guest had printed), where the copy goes on after a restore."""
    save_seconds: float = 0.0
    save_bytes: int = 0
    """The size of the last save (the memory states of all the job's VMs), measured where they
    were saved: with `memory_path`, the pilot's record that the memory is kept (memory_saved)."""
    restore_seconds: float = 0.0
    memory_path: str = ""
    """The saved memory state (while saved); the VM driver's file."""
    console_log: str = ""
    request_id: str = ""
    """The checkpoint request this save answers ("" for a save on SIGTERM); for a switch
    request (RequestKind other than checkpoint), the last one the pilot carried out or refused."""
    request_error: str = ""
    """Why the pilot could not carry out the switch request `request_id` ("" when it did)."""
    cpu_seconds: float = 0.0
    """CPU time the running VM has used (libvirt's counter), read at `cpu_at`: two readings
    give the VM's measured CPU demand (preemption.planner.control.cpu_demand)."""
    cpu_at: float = 0.0
    vcpus: int = 0
    message: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)
    """One entry per state change: {"state", "at", "node"}: the demo's timeline."""

    def moved(self, state: PilotState, *, at: float | None = None, **changes: Any) -> PilotStatus:
        t = time.time() if at is None else at
        entry = {"state": state.value, "at": t, "node": changes.get("node", self.node)}
        return replace(self, state=state, since=t, history=[*self.history, entry], **changes)

    @property
    def memory_saved(self) -> bool:
        """Whether the pilot recorded its VM's memory state as kept: the state's path and the
        save's byte count, which the pilot writes together once the driver has saved the VM on
        its node and measured the file there (a restore clears the path). The agent's view.

        Why the record and not the file: the agent reads this on the controller, where a VM
        directory of the node's own (`[provisioning] user_vm_dir`, a `vm_dir` not shared) is no
        file, and every checkpoint of such a job waited for a save it had long finished. A
        record without a byte count (not written by vjob's pilot, which always counted) is
        judged by the file as it was before (memory_on_this_host)."""
        if not self.memory_path:
            return False
        return self.save_bytes > 0 or self.memory_on_this_host

    @property
    def memory_on_this_host(self) -> bool:
        """Whether the memory state's file is here: the node's view (the pilot deciding between a
        restore and a boot), true only where that directory is mounted. Never raises: the path
        is the user's text, and a name the kernel refuses (ENAMETOOLONG, EACCES…) is not there."""
        if not self.memory_path:
            return False
        try:
            return os.path.exists(self.memory_path)
        except (OSError, ValueError):
            return False

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["state"] = self.state.value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], *, source: str) -> PilotStatus:
        """Typed validation: every field of the declared type, numbers finite and >= 0, names
        from a safe alphabet, texts and lists bounded. Unknown keys are ignored."""
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                if f.name in ("job_id", "vm", "node", "uri", "state", "since"):
                    raise InputError(f"{source}: not a pilot state file: field {f.name!r} missing")
                continue
            kwargs[f.name] = _typed(f.name, data[f.name], source)
        return cls(**kwargs)


class RequestKind(StrEnum):
    """What the agent asks a pilot. `checkpoint` (the RMS mode): save, then wait to be
    requeued. The others carry out one action of a context-switch plan (preemption.executor)
    with the job staying allocated: `suspend` saves and keeps the VM asleep until a `resume`
    (on `node`, from the state on `from_node`), `migrate` moves the running VM live to `node`,
    `stop` powers it off and ends the job. Removing a `suspend` request wakes the VM where it
    slept (the switch was rolled back). `release` lets a pilot whose job ended go (it holds its
    node while a VM remapping lent it still runs there, docs/remap.md). `pause_checkpoint`: a
    checkpoint that pauses the VM, answers `saving` at once (the RMS may then hand its CPUs over)
    and saves from a process outside the job's (pilot.pause_drain, docs/preempt-pause.md)."""

    CHECKPOINT = "checkpoint"
    PAUSE_CHECKPOINT = "pause_checkpoint"
    SUSPEND = "suspend"
    RESUME = "resume"
    MIGRATE = "migrate"
    STOP = "stop"
    RELEASE = "release"


@dataclass(frozen=True)
class CheckpointRequest:
    """The agent asks the pilot to act on its VM; `request_id` comes back in the pilot's state."""

    request_id: str
    at: float
    reason: str = ""
    nodes: tuple[str, ...] = ()
    """The nodes the job holds: where a local resume should put it back."""
    kind: RequestKind = RequestKind.CHECKPOINT
    node: str = ""
    """resume, migrate: the node the VM goes to."""
    from_node: str = ""
    """resume: the node holding the saved state ("" for the node the pilot saved it on)."""


_FLOATS = {"since", "save_seconds", "restore_seconds", "cpu_seconds", "cpu_at"}
_INTS = {"pid", "memory_mb", "boots", "restores", "local_restores", "console_bytes_at_save", "save_bytes", "vcpus"}
_NAMES = {"job_id", "vm", "node", "image", "saved_node", "request_id"}
_PATHS = {"uri", "memory_path", "console_log", "message", "request_error"}


def _shown(value: Any) -> str:
    """At most 80 characters of a hostile value for an error message (repr of a 4000-digit
    integer is itself a long computation, and str() of a longer one raises)."""
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        return f"<an integer of about {value.bit_length() * 3 // 10} digits>"
    return str(value)[:80]


def _typed(name: str, value: Any, source: str) -> Any:
    def bad(rule: str) -> InputError:
        return InputError(f"{source}: field {name!r} = {_shown(value)!r}: {rule}")

    if name == "state":
        try:
            return PilotState(value)
        except ValueError:
            raise bad(f"must be one of {', '.join(s.value for s in PilotState)}") from None
    if name in _FLOATS:
        return _finite(value, bad)
    if name in _INTS:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
            raise bad("must be an integer >= 0")
        return value
    if name in _NAMES:
        if not isinstance(value, str) or not NAME.fullmatch(value):
            raise bad("must be a name of letters, digits and . _ @ : - (at most 128)")
        return value
    if name in _PATHS:
        if not isinstance(value, str) or len(value) > MAX_TEXT or "\0" in value:
            raise bad(f"must be a string of at most {MAX_TEXT} characters")
        return value
    if name == "output_bytes_at_save":
        if (
            not isinstance(value, list)
            or len(value) > 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63 for v in value)
        ):
            raise bad("must be a list of at most two byte counts")
        return list(value)
    if name in ("saved_nodes", "member_nodes"):
        if (
            not isinstance(value, list)
            or len(value) > 4096
            or not all(isinstance(v, str) and NAME.fullmatch(v) for v in value)
        ):
            raise bad("must be a list of node names")
        return list(value)
    if name == "history":
        if not isinstance(value, list) or len(value) > MAX_HISTORY or not all(isinstance(v, dict) for v in value):
            raise bad(f"must be a list of at most {MAX_HISTORY} objects")
        return list(value)
    raise bad("unknown field")


def _finite(value: Any, bad: Any) -> float:
    """A finite number >= 0 as a float. Why the integer bound first: JSON integers have no size
    limit, and math.isfinite or float() of 10**400 raises OverflowError, not a refusal."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad("must be a finite number >= 0")
    if isinstance(value, int) and not 0 <= value < 2**63:
        raise bad("must be a finite number >= 0 (below 2**63)")
    if not math.isfinite(value) or value < 0:
        raise bad("must be a finite number >= 0")
    return float(value)


def request_from_json(data: dict[str, Any], *, source: str) -> CheckpointRequest:
    """A CheckpointRequest from the JSON object of a request file; InputError naming the field."""

    def bad(name: str, rule: str) -> InputError:
        return InputError(f"{source}: field {name!r} = {_shown(data.get(name))!r}: {rule}")

    for name in ("request_id", "at"):
        if name not in data:
            raise InputError(f"{source}: not a checkpoint request: field {name!r} missing")
    names: dict[str, str] = {}
    for name in ("request_id", "node", "from_node"):
        value = data.get(name, "")
        if not isinstance(value, str) or not NAME.fullmatch(value):
            raise bad(name, "must be a name of letters, digits and . _ @ : - (at most 128)")
        names[name] = value
    at = _finite(data["at"], lambda rule: bad("at", rule))
    reason = data.get("reason", "")
    if not isinstance(reason, str) or len(reason) > MAX_TEXT:
        raise bad("reason", f"must be a string of at most {MAX_TEXT} characters")
    nodes = data.get("nodes", [])
    if (
        not isinstance(nodes, list)
        or len(nodes) > 4096
        or not all(isinstance(n, str) and NAME.fullmatch(n) for n in nodes)
    ):
        raise bad("nodes", "must be a list of at most 4096 node names")
    kind = data.get("kind", RequestKind.CHECKPOINT.value)
    if not isinstance(kind, str) or kind not in {k.value for k in RequestKind}:
        raise bad("kind", f"must be one of {', '.join(k.value for k in RequestKind)}")
    req = CheckpointRequest(
        names["request_id"], at, reason, tuple(nodes), RequestKind(kind), names["node"], names["from_node"]
    )
    if req.kind in (RequestKind.RESUME, RequestKind.MIGRATE) and not req.node:
        raise InputError(f"{source}: a {req.kind.value} request needs field 'node'")
    return req
