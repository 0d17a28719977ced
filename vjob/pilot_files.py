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
<data_dir>/pilots, on a filesystem the agent and the compute nodes share). The pilot root is 1777,
so that name may be taken by another user first: the job's directory is then a
`<rms>-<job id>~<16 random hex>` its pilot made, and which one is the job's is decided by its
owner, never by its name (PilotDir.ensure, find_dir; the agent: agent.observe.read_pilots):
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
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from vjob.config import Config
from vjob.errors import InputError, VjobError

_JOB_ID = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_KEY = re.compile(r"~[0-9a-f]{16}")
"""The key of a pilot directory made beside a taken plain name (PilotDir.ensure): `~` is not in
the job-id alphabet, so `<rms>-<id>~<key>` is never another job's name."""
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
        """Whether the claimed memory state is there. Never raises: the path is the user's
        text, and a name the kernel refuses (ENAMETOOLONG, EACCES…) is simply not a saved state."""
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


def validate_job_id(job_id: str) -> str:
    """Job ids become directory and VM names: only a safe alphabet is allowed."""
    if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):
        raise InputError(f"job id {job_id!r}: must be 1-64 characters of letters, digits, '.', '_' or '-'")
    return job_id


def vm_name(rms: str, job_id: str) -> str:
    """The libvirt domain name of a vjob of one VM, and the base of the names of a vjob of
    several (vm_names): derived from the job id, never taken from a file."""
    return f"vjob-{rms}-{validate_job_id(job_id)}"


def member_names(vm: str, count: int) -> list[str]:
    """The VM names of a multi-node vjob of `count` VMs, one per node: `<vm>-<rank>`, rank 0
    (the one running the script, agent.pilot_multinode) first."""
    return [f"{vm}-{rank}" for rank in range(count)]


def vm_names(rms: str, job_id: str, count: int = 1) -> list[str]:
    """Every VM name of a vjob of `count` VMs, rank 0 first, from its job id alone: one VM is
    `vjob-<rms>-<id>`, a vjob of several (a VM per node) has `vjob-<rms>-<id>-<rank>`, rank <
    count. Why one function: the pilot names its VMs with it, and the agent believes no other
    name a state file gives (claimed_vms) — nor deletes any (the store records these)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InputError(f"VM count {str(count)[:20]!r}: must be an integer >= 1")
    base = vm_name(rms, job_id)
    return [base] if count == 1 else member_names(base, count)


def vms_of(st: PilotStatus) -> list[tuple[str, str]]:
    """(VM, node) of each VM a pilot's state speaks of, rank 0 (the state's `vm`) first: each
    `<vm>-<rank>` of a multi-node pilot on the node its `member_nodes` names, else its one VM on
    its node (the node it was saved on, while saved). Only for a state claimed_vms accepted (the
    agent's observation holds no other): the names are then the ones derived from the job id."""
    if len(st.member_nodes) > 1 and st.vm.endswith("-0"):
        names = member_names(st.vm.removesuffix("-0"), len(st.member_nodes))
        return list(zip(names, st.member_nodes, strict=True))
    return [(st.vm, (st.saved_node or st.node) if st.state is PilotState.SAVED else st.node)]


def claimed_vms(rms: str, job_id: str, st: PilotStatus, *, max_vms: int | None = None) -> list[tuple[str, str]]:
    """(VM, node) of each VM the state `st`, read from job `job_id`'s pilot directory, speaks
    of (vms_of), once it is checked to claim only that job's VMs: its `job_id` is the job's, its
    `vm` is rank 0's name derived from the job id for as many VMs as `member_nodes` lists (one
    when it lists none), one per node (no node twice), at most `max_vms` (the nodes of the
    cluster: the RMS's count for the job itself is not steady — Slurm shows a requeued job with
    one node while it winds up). InputError naming the field and value otherwise. Where a VM's
    node matters (recording it, checkpointing it) the agent also checks the RMS allocated it."""
    where = f"pilot state of job {job_id}"
    if st.job_id != job_id:
        raise InputError(f"{where}: field 'job_id' = {st.job_id[:80]!r}: not this job")
    count = max(1, len(st.member_nodes))
    if max_vms is not None and count > max_vms:
        raise InputError(f"{where}: field 'member_nodes' lists {count} nodes: the cluster has {max_vms}")
    twice = sorted(n for n, times in Counter(st.member_nodes).items() if times > 1)
    if twice:
        raise InputError(f"{where}: field 'member_nodes' names {', '.join(twice)[:80]!r} twice: one VM per node")
    first = vm_names(rms, job_id, count)[0]
    if st.vm != first:
        raise InputError(f"{where}: field 'vm' = {st.vm[:80]!r}: must be {first!r} (a vjob of {count} VM(s))")
    return vms_of(st)


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
    except (ValueError, RecursionError) as exc:
        # ValueError: JSONDecodeError, UnicodeDecodeError and the integer-digit limit alike
        raise InputError(f"{path}: not valid JSON ({str(exc)[:200]})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    return data


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
        if not isinstance(value, str) or not _NAME.fullmatch(value):
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
        or not all(isinstance(n, str) and _NAME.fullmatch(n) for n in nodes)
    ):
        raise bad("nodes", "must be a list of at most 4096 node names")
    kind = data.get("kind", RequestKind.CHECKPOINT.value)
    if not isinstance(kind, str) or kind not in {k.value for k in RequestKind}:
        raise bad("kind", f"must be one of {', '.join(k.value for k in RequestKind)}")
    req = CheckpointRequest(names["request_id"], at, reason, tuple(nodes), RequestKind(kind), names["node"],
                            names["from_node"])  # fmt: skip
    if req.kind in (RequestKind.RESUME, RequestKind.MIGRATE) and not req.node:
        raise InputError(f"{source}: a {req.kind.value} request needs field 'node'")
    return req


class PilotDir:
    """The directory of one vjob (see the module docstring for the layout)."""

    def __init__(
        self, root: Path, rms: str, job_id: str, *, name: str | None = None, owners: Sequence[int] | None = None
    ) -> None:
        """`name`: the entry under `root`, `<rms>-<job id>` (the default) or a keyed
        `<rms>-<job id>~<16 hex>` a pilot made when the plain name was taken (ensure).
        `owners`: the uids root may hear there (the job's user's, root's); reading the state or
        writing a request in a directory anybody else owns is then an InputError."""
        self.owners = tuple(owners) if owners is not None else None
        self.rms = rms
        self.job_id = validate_job_id(job_id)
        self.root = Path(root)
        plain = f"{rms}-{job_id}"
        if name is not None and name != plain and not (name.startswith(plain) and _KEY.fullmatch(name[len(plain) :])):
            raise InputError(f"pilot directory {name[:80]!r}: not a directory of job {job_id}")
        self.path = self.root / (name or plain)

    @property
    def vm(self) -> str:
        """The VM name of the job as a vjob of one VM, derived from the job id (never taken from
        a file); a vjob of several VMs has vm_names(rms, job_id, count), see claimed_vms."""
        return vm_name(self.rms, self.job_id)

    def check_owner(self, user: str | None) -> int | None:
        """Refuse a directory that is a symlink or is owned by neither `user` nor root (None: a
        job nobody vouches for, whose directory only root may have made); the owner's uid (None:
        no directory)."""
        owner = self._owner()
        if owner is None:
            return None
        try:
            uid = pwd.getpwnam(user).pw_uid if user else None
        except KeyError:
            uid = None
        if owner not in (0, uid):
            raise InputError(f"{self.path}: owned by uid {owner}, not by the job's user {user!r}")
        return owner

    def _owner(self) -> int | None:
        """The uid owning the directory itself (None: no directory); InputError for a link or
        anything but a directory."""
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            raise InputError(f"{self.path}: not a plain directory")
        return info.st_uid

    @property
    def state_file(self) -> Path:
        return self.path / "state.json"

    @property
    def request_file(self) -> Path:
        return self.path / "request.json"

    def ensure(self) -> None:
        """Find or make this job's directory as the caller (the pilot, as the job's user), owner-only
        (it will hold the job's memory), and point `path` at it.

        Why keyed by owner and not by name: the pilot root is 1777 and job ids are sequential, so
        anyone can make `<rms>-<next id>` first, and the sticky bit then forbids the job's user to
        remove or change it. The job's directory is the entry of that job owned by the caller:
        `<rms>-<id>` when it is the caller's or free, else a `<rms>-<id>~<random>` the caller made
        (O_EXCL mkdir: a name nobody could take first). A requeued pilot finds the same one; the
        agent reads only the one owned by the job's user (observe.read_pilots), so a squatter's
        entry is never heard and never in the way. VjobError, one line, when there is none to be had.
        """
        me = os.geteuid()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            found = find_dir(self.root, self.rms, self.job_id, (me,))
            if found is not None:
                self.path = found.path
            else:
                self.path = self.root / f"{self.rms}-{self.job_id}"
                try:
                    os.mkdir(self.path, 0o700)
                except FileExistsError:  # taken (by another user, or a link): a name of our own
                    self.path = _mkdir_keyed(self.root, f"{self.rms}-{self.job_id}")
            info = os.lstat(self.path)
            if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode) or info.st_uid != me:
                raise VjobError(f"pilot directory {self.path} of job {self.job_id}: not a directory of uid {me}")
            if stat.S_IMODE(info.st_mode) != 0o700:
                fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
                try:
                    os.fchmod(fd, 0o700)
                finally:
                    os.close(fd)
        except OSError as exc:
            raise VjobError(
                f"pilot directory of job {self.job_id} under {self.root}: {exc.strerror or exc}"
                f"{f' ({exc.filename})' if exc.filename else ''}"
            ) from None

    def exists(self) -> bool:
        return self.state_file.exists()

    # -- the pilot's side -------------------------------------------------------------
    def _vouched(self) -> None:
        """With `owners` set: refuse a directory that is a link or anybody else's."""
        if self.owners is None:
            return
        owner = self._owner()
        if owner is not None and owner not in self.owners:
            raise InputError(f"{self.path}: owned by uid {owner}, not by the job's user or root")

    def read_state(self) -> PilotStatus | None:
        self._vouched()
        data = _read(self.state_file)
        return None if data is None else PilotStatus.from_json(data, source=str(self.state_file))

    def write_state(self, status: PilotStatus) -> None:
        _write_atomic(self.state_file, status.to_json())

    def read_request(self) -> CheckpointRequest | None:
        """The agent's request, read as the state file is (the directory is the user's, so the
        file may be anyone's text): every field typed, names matched whole, lists bounded."""
        data = _read(self.request_file)
        if data is None:
            return None
        return request_from_json(data, source=str(self.request_file))

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
        self._vouched()
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

    def withdraw_request(self) -> bool:
        """Remove the agent's request; False when this directory is not one root may touch.

        Why through a descriptor: unlinking by path follows a symlink the directory's owner
        swapped in for it (their own entry renamed away, a link to another job's directory put
        in its place), and root deleted another user's request. The directory is opened with
        O_NOFOLLOW, its owner checked on that descriptor (`owners`, when set), and the file
        unlinked relative to it: what is checked is what is touched."""
        try:
            dfd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return True
        except OSError:  # a symlink (ELOOP), a file in its place: not this job's directory
            return False
        try:
            if self.owners is not None and os.fstat(dfd).st_uid not in self.owners:
                return False
            try:
                os.unlink(self.request_file.name, dir_fd=dfd)
            except FileNotFoundError:
                pass
            return True
        finally:
            os.close(dfd)

    def saved_for(self, request_id: str) -> bool:
        """True when the pilot has saved the VM in answer to `request_id` (a state file that
        fails validation is "not yet": the request times out and is withdrawn)."""
        try:
            st = self.read_state()
        except InputError:
            return False
        return st is not None and st.state is PilotState.SAVED and st.request_id == request_id and st.memory_saved


def _mkdir_keyed(root: Path, plain: str) -> Path:
    """Make `<plain>~<16 random hex>` (0700) under `root`: nobody can have taken it first."""
    for _ in range(16):
        path = root / f"{plain}~{secrets.token_hex(8)}"
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue
    raise VjobError(f"pilot directory {plain} under {root}: no free name after 16 tries")


def _job_of(name: str, rms: str) -> str | None:
    """The job id of a directory entry `<rms>-<id>` or `<rms>-<id>~<key>`; None for others."""
    prefix = f"{rms}-"
    if not name.startswith(prefix):
        return None
    job_id, sep, key = name[len(prefix) :].partition("~")
    if not _JOB_ID.fullmatch(job_id) or (sep and not _KEY.fullmatch(sep + key)):
        return None
    return job_id


def _entries(root: Path, rms: str) -> list[tuple[str, str]]:
    """(job id, entry name) of every plain directory of `rms` under `root` (no symlinks), each
    job's plain name before its keyed ones."""
    try:
        with os.scandir(root) as it:
            names = [e.name for e in it if e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = [(job_id, n) for n in names if (job_id := _job_of(n, rms)) is not None]
    return sorted(out, key=lambda e: (e[0], "~" in e[1], e[1]))


def find_dir(root: Path, rms: str, job_id: str, uids: Sequence[int]) -> PilotDir | None:
    """The directory of job `job_id` owned by the first of `uids` that owns one (the pilot: its
    own uid; the agent: the job's user, then root), its plain name first; None when none is."""
    plain = f"{rms}-{validate_job_id(job_id)}"
    owned: dict[int, PilotDir] = {}
    for _, name in (e for e in _entries(root, rms) if e[0] == job_id and e[1].startswith(plain)):
        try:
            info = os.lstat(root / name)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid in uids and info.st_uid not in owned:
            owned[info.st_uid] = PilotDir(root, rms, job_id, name=name)
    return next((owned[u] for u in uids if u in owned), None)


def all_dirs(root: Path, rms: str) -> list[PilotDir]:
    """Every vjob directory of `rms` under `root` that has a state file: for one job there may be
    several (a squatter's and the job's own, ensure); whose to believe is the reader's check."""
    root = Path(root)
    return [
        PilotDir(root, rms, job_id, name=name)
        for job_id, name in _entries(root, rms)
        if os.path.lexists(root / name / "state.json")
    ]
