"""The pilot directory of one vjob: the only channel between its pilot and the agent.

Why files and not the database or an RMS signal: the pilot runs inside the job's allocation on
a compute node, where the state store may be out of reach (and a pilot must never fail a job
because the database is down), while every RMS has its own way to signal a job. A directory
per job on a filesystem shared with the agent holds the pilot's state file and the agent's
checkpoint request. Every write is an atomic rename, so a reader never sees half a file and a
process killed mid-write leaves the previous version.

Who writes what, and what root trusts: the directory and state.json belong to the job's user
(the pilot runs as that user), so the root agent reads them as hostile data — opened without
following symlinks, only if a regular file, at most MAX_FILE_BYTES, every field type-checked —
and only in a directory owned by the job's user (or root). The agent's own request.json is
written through a directory descriptor opened without following symlinks, to a random
O_EXCL|O_NOFOLLOW temporary name, then renamed over: a planted symlink is replaced, never
followed.

Layout of `<pilot_dir>/<rms>-<job id>/` (mode 0700, files 0600; `[agent] pilot_dir`, default
<data_dir>/pilots, on a filesystem the agent and the compute nodes share):
  state.json    written by the pilot: where the VM runs, what it is doing, where it was saved
  request.json  written by the agent: "checkpoint now" (removed to withdraw it), or one action
                of a context switch: suspend, resume on a node, migrate, stop (RequestKind)
The VM's overlay, console log and memory state are where the VM driver keeps them
(provisioning.driver); state.json names the paths.
"""

from __future__ import annotations

import json
import math
import os
import pwd
import re
import secrets
import stat
import time
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from vjob.config import Config
from vjob.errors import InputError

_JOB_ID = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_NAME = re.compile(r"[A-Za-z0-9_.@:\-]{0,128}")
MAX_FILE_BYTES = 256 * 1024
"""A state or request file larger than this is refused (a history of a few hundred moves)."""
MAX_HISTORY = 1000
MAX_TEXT = 4096


def pilot_root(cfg: Config) -> Path:
    """Where the pilots' directories (state files, checkpoint requests) live."""
    return Path(cfg.agent.pilot_dir) if cfg.agent.pilot_dir else cfg.data_path / "pilots"


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
        return bool(self.memory_path) and Path(self.memory_path).exists()

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
    node while a VM remapping lent it still runs there, docs/remap.md)."""

    CHECKPOINT = "checkpoint"
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


def _typed(name: str, value: Any, source: str) -> Any:
    def bad(rule: str) -> InputError:
        return InputError(f"{source}: field {name!r} = {str(value)[:80]!r}: {rule}")

    if name == "state":
        try:
            return PilotState(value)
        except ValueError:
            raise bad(f"must be one of {', '.join(s.value for s in PilotState)}") from None
    if name in _FLOATS:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise bad("must be a finite number >= 0")
        return float(value)
    if name in _INTS:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
            raise bad("must be an integer >= 0")
        return value
    if name in _NAMES:
        if not isinstance(value, str) or not _NAME.fullmatch(value):
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
            or not all(isinstance(v, str) and _NAME.fullmatch(v) for v in value)
        ):
            raise bad("must be a list of node names")
        return list(value)
    if name == "history":
        if not isinstance(value, list) or len(value) > MAX_HISTORY or not all(isinstance(v, dict) for v in value):
            raise bad(f"must be a list of at most {MAX_HISTORY} objects")
        return list(value)
    raise bad("unknown field")


def validate_job_id(job_id: str) -> str:
    """Job ids become directory and VM names: only a safe alphabet is allowed."""
    if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):
        raise InputError(f"job id {job_id!r}: must be 1-64 characters of letters, digits, '.', '_' or '-'")
    return job_id


def vm_name(rms: str, job_id: str) -> str:
    """The libvirt domain name of a vjob's VM (one VM per vjob in this version)."""
    return f"vjob-{rms}-{validate_job_id(job_id)}"


def _open_dir(path: Path) -> int:
    """A descriptor of directory `path` itself: never a symlink's target."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise InputError(f"{path}: not a directory vjob may use ({exc.strerror})") from None


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write `path` whole or not at all, without ever following a link planted in its directory:
    a random O_EXCL|O_NOFOLLOW temporary file in the directory's descriptor, renamed over."""
    body = json.dumps(data, indent=1, sort_keys=True).encode()
    dfd = _open_dir(path.parent)
    try:
        tmp = f".{path.name}.{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(body)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            os.unlink(tmp, dir_fd=dfd)
            raise
    finally:
        os.close(dfd)


def _read(path: Path) -> dict[str, Any] | None:
    """A JSON object from `path`, read as hostile data: no symlink, a regular file (a FIFO would
    block the reader for good), at most MAX_FILE_BYTES. None when there is no file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read safely ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{path}: not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise InputError(f"{path}: {info.st_size} bytes, over the {MAX_FILE_BYTES}-byte limit")
        raw = os.read(fd, MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_FILE_BYTES:
        raise InputError(f"{path}: over the {MAX_FILE_BYTES}-byte limit")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InputError(f"{path}: not valid JSON ({str(exc)[:200]})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    return data


class PilotDir:
    """The directory of one vjob (see the module docstring for the layout)."""

    def __init__(self, root: Path, rms: str, job_id: str) -> None:
        self.rms = rms
        self.job_id = validate_job_id(job_id)
        self.path = Path(root) / f"{rms}-{job_id}"

    @property
    def vm(self) -> str:
        """The job's VM name, derived from the job id (never taken from a file)."""
        return vm_name(self.rms, self.job_id)

    def check_owner(self, user: str) -> None:
        """Refuse a directory that is a symlink or is owned by neither `user` nor root."""
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            raise InputError(f"{self.path}: not a plain directory")
        try:
            uid = pwd.getpwnam(user).pw_uid
        except KeyError:
            uid = None
        if info.st_uid not in (0, uid):
            raise InputError(f"{self.path}: owned by uid {info.st_uid}, not by the job's user {user!r}")

    @property
    def state_file(self) -> Path:
        return self.path / "state.json"

    @property
    def request_file(self) -> Path:
        return self.path / "request.json"

    def ensure(self) -> None:
        """Create the directory owner-only: it will hold the job's memory."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.path, 0o700)

    def exists(self) -> bool:
        return self.state_file.exists()

    # -- the pilot's side -------------------------------------------------------------
    def read_state(self) -> PilotStatus | None:
        data = _read(self.state_file)
        return None if data is None else PilotStatus.from_json(data, source=str(self.state_file))

    def write_state(self, status: PilotStatus) -> None:
        _write_atomic(self.state_file, status.to_json())

    def read_request(self) -> CheckpointRequest | None:
        data = _read(self.request_file)
        if data is None:
            return None
        try:
            req = CheckpointRequest(
                str(data["request_id"]), float(data["at"]), str(data.get("reason", "")),
                tuple(str(n) for n in data.get("nodes", ())), RequestKind(data.get("kind", "checkpoint")),
                str(data.get("node", "")), str(data.get("from_node", "")),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise InputError(f"{self.request_file}: not a checkpoint request ({exc})") from None
        for name in ("request_id", "node", "from_node"):
            if not _NAME.fullmatch(getattr(req, name)):
                raise InputError(f"{self.request_file}: field {name!r} = {getattr(req, name)[:80]!r}: not a name")
        if req.kind in (RequestKind.RESUME, RequestKind.MIGRATE) and not req.node:
            raise InputError(f"{self.request_file}: a {req.kind.value} request needs field 'node'")
        return req

    # -- the agent's side -------------------------------------------------------------
    def request_checkpoint(self, request_id: str, reason: str = "", nodes: tuple[str, ...] = ()) -> CheckpointRequest:
        return self.request(RequestKind.CHECKPOINT, request_id, reason=reason, nodes=nodes)

    def request(
        self,
        kind: RequestKind,
        request_id: str,
        *,
        node: str = "",
        from_node: str = "",
        reason: str = "",
        nodes: tuple[str, ...] = (),
    ) -> CheckpointRequest:
        """Ask for one switch action (see RequestKind); replaces any earlier request atomically,
        so a sleeping pilot never sees the file gone between a `suspend` and its `resume`."""
        for name, value in (("request_id", request_id), ("node", node), ("from_node", from_node)):
            if not _NAME.fullmatch(value):
                raise InputError(f"pilot request: {name} = {value[:80]!r}: not a name")
        req = CheckpointRequest(request_id, time.time(), reason, tuple(nodes), RequestKind(kind), node, from_node)
        data = asdict(req)
        data["kind"] = req.kind.value
        _write_atomic(self.request_file, data)
        return req

    def answer_to(self, request_id: str) -> PilotStatus | None:
        """The pilot's state once it has carried out (or refused, `request_error`) the switch
        request `request_id`; None while it has not (an unreadable state file is "not yet")."""
        try:
            st = self.read_state()
        except InputError:
            return None
        if st is None or st.request_id != request_id:
            return None
        if st.request_error or st.state in (PilotState.RUNNING, PilotState.FINISHED):
            return st
        return st if st.state is PilotState.SAVED and st.memory_saved else None

    def withdraw_request(self) -> None:
        self.request_file.unlink(missing_ok=True)

    def saved_for(self, request_id: str) -> bool:
        """True when the pilot has saved the VM in answer to `request_id` (a state file that
        fails validation is "not yet": the request times out and is withdrawn)."""
        try:
            st = self.read_state()
        except InputError:
            return False
        return st is not None and st.state is PilotState.SAVED and st.request_id == request_id and st.memory_saved


def all_dirs(root: Path, rms: str) -> list[PilotDir]:
    """Every vjob directory of `rms` under `root` that has a state file."""
    if not root.is_dir():
        return []
    out = []
    prefix = f"{rms}-"
    for entry in sorted(root.iterdir()):
        if entry.is_symlink() or not entry.is_dir() or not entry.name.startswith(prefix):
            continue
        job_id = entry.name[len(prefix) :]
        if _JOB_ID.fullmatch(job_id) and os.path.lexists(entry / "state.json"):
            out.append(PilotDir(root, rms, job_id))
    return out
