"""The pilot directory of one vjob and its two files: made and found by owner, written by
atomic rename through a directory descriptor, read as hostile data (the package docstring
gives the layout and who trusts what)."""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import stat
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from vjob.config import Config
from vjob.errors import InputError, VjobError
from vjob.pilot_files.names import JOB_ID, validate_job_id, vm_name
from vjob.pilot_files.records import (
    NAME,
    CheckpointRequest,
    PilotState,
    PilotStatus,
    RequestKind,
    request_from_json,
)

_KEY = re.compile(r"~[0-9a-f]{16}")
"""The key of a pilot directory made beside a taken plain name (PilotDir.ensure): `~` is not in
the job-id alphabet, so `<rms>-<id>~<key>` is never another job's name."""
MAX_FILE_BYTES = 256 * 1024
"""A state or request file larger than this is refused (a history of a few hundred moves)."""


def pilot_root(cfg: Config) -> Path:
    """Where the pilots' directories (state files, checkpoint requests) live."""
    return Path(cfg.agent.pilot_dir) if cfg.agent.pilot_dir else cfg.data_path / "pilots"


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
                owner = os.fstat(dfd)
                if os.geteuid() == 0 and owner.st_uid != 0:  # the agent (root) writing to a user's pilot:
                    os.fchown(fh.fileno(), owner.st_uid, owner.st_gid)  # the pilot must read it, no one else
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


class PilotDir:
    """The directory of one vjob (the package docstring gives the layout)."""

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
            if not NAME.fullmatch(value):
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
    if not JOB_ID.fullmatch(job_id) or (sep and not _KEY.fullmatch(sep + key)):
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
