"""The pilot directory of one vjob: the only channel between its pilot and the agent.

Why files and not the database or an RMS signal: the pilot runs inside the job's allocation on
a compute node, where the state store may be out of reach (and a pilot must never fail a job
because the database is down), while every RMS has its own way to signal a job. A directory
per job on a filesystem shared with the agent holds the pilot's state file and the agent's
checkpoint request. Every write is an atomic rename, so a reader never sees half a file and a
process killed mid-write leaves the previous version.

Layout of `<pilot_dir>/<rms>-<job id>/` (mode 0700, files 0600; `[agent] pilot_dir`, default
<data_dir>/pilots, on a filesystem the agent and the compute nodes share):
  state.json    written by the pilot: where the VM runs, what it is doing, where it was saved
  request.json  written by the agent: "checkpoint now" (removed to withdraw it)
The VM's overlay, console log and memory state are where the VM driver keeps them
(provisioning.driver); state.json names the paths.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from vjob.errors import InputError

_JOB_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


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
    console_bytes_at_save: int = 0
    """Size of the console log when the VM was last saved: what the guest printed before."""
    save_seconds: float = 0.0
    save_bytes: int = 0
    restore_seconds: float = 0.0
    memory_path: str = ""
    """The saved memory state (while saved); the VM driver's file."""
    console_log: str = ""
    request_id: str = ""
    """The checkpoint request this save answers ("" for a save on SIGTERM)."""
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
        known = set(cls.__dataclass_fields__)
        try:
            kwargs = {k: v for k, v in data.items() if k in known}
            kwargs["state"] = PilotState(data["state"])
            return cls(**kwargs)
        except (KeyError, ValueError, TypeError) as exc:
            raise InputError(f"{source}: not a pilot state file ({exc})") from None


@dataclass(frozen=True)
class CheckpointRequest:
    """The agent asks the pilot to save its VM; `request_id` comes back in the pilot's state."""

    request_id: str
    at: float
    reason: str = ""
    nodes: tuple[str, ...] = ()
    """The nodes the job holds: where a local resume should put it back."""


def validate_job_id(job_id: str) -> str:
    """Job ids become directory and VM names: only a safe alphabet is allowed."""
    if not _JOB_ID.match(job_id or ""):
        raise InputError(f"job id {job_id!r}: must be 1-64 characters of letters, digits, '.', '_' or '-'")
    return job_id


def vm_name(rms: str, job_id: str) -> str:
    """The libvirt domain name of a vjob's VM (one VM per vjob in this version)."""
    return f"vjob-{rms}-{validate_job_id(job_id)}"


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None
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
            return CheckpointRequest(
                str(data["request_id"]), float(data["at"]), str(data.get("reason", "")),
                tuple(str(n) for n in data.get("nodes", ())),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{self.request_file}: not a checkpoint request ({exc})") from None

    # -- the agent's side -------------------------------------------------------------
    def request_checkpoint(self, request_id: str, reason: str = "", nodes: tuple[str, ...] = ()) -> CheckpointRequest:
        req = CheckpointRequest(request_id, time.time(), reason, tuple(nodes))
        _write_atomic(self.request_file, asdict(req))
        return req

    def withdraw_request(self) -> None:
        self.request_file.unlink(missing_ok=True)

    def saved_for(self, request_id: str) -> bool:
        """True when the pilot has saved the VM in answer to `request_id`."""
        st = self.read_state()
        return st is not None and st.state is PilotState.SAVED and st.request_id == request_id and st.memory_saved


def all_dirs(root: Path, rms: str) -> list[PilotDir]:
    """Every vjob directory of `rms` under `root` that has a state file."""
    if not root.is_dir():
        return []
    out = []
    for entry in sorted(root.iterdir()):
        prefix = f"{rms}-"
        if entry.is_dir() and entry.name.startswith(prefix) and (entry / "state.json").exists():
            job_id = entry.name[len(prefix) :]
            if _JOB_ID.match(job_id):
                out.append(PilotDir(root, rms, job_id))
    return out
